//! The raw flag words a trace records decode as Linux defines them: the engine's tables
//! (`usermm::MapFlags`, `MremapFlags::from_bits`, `MlockallFlags::from_bits`,
//! `MLOCK_ONFAULT`) checked against the C library's constants of this host.

use usermm::{MapFlags, MlockallFlags, MremapFlags, Placement, Sharing, MLOCK_ONFAULT};

fn bits(v: i32) -> u32 {
    u32::try_from(v).unwrap()
}

#[test]
fn mmap_flag_bits_are_linux_s() {
    for (ours, linux) in [
        (MapFlags::PRIVATE, libc::MAP_PRIVATE),
        (MapFlags::FIXED, libc::MAP_FIXED),
        (MapFlags::ANONYMOUS, libc::MAP_ANONYMOUS),
        (MapFlags::LOCKED, libc::MAP_LOCKED),
        (MapFlags::NORESERVE, libc::MAP_NORESERVE),
        (MapFlags::POPULATE, libc::MAP_POPULATE),
        (MapFlags::HUGETLB, libc::MAP_HUGETLB),
        (MapFlags::FIXED_NOREPLACE, libc::MAP_FIXED_NOREPLACE),
    ] {
        assert_eq!(ours, bits(linux));
    }
    assert_eq!(MLOCK_ONFAULT, libc::MLOCK_ONFAULT);
}

#[test]
fn mmap_flags_decode() {
    let f = |v: i32| MapFlags(bits(v));
    let private = f(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE);
    assert_eq!(private.sharing(), Sharing::Private);
    assert!(private.anonymous() && private.populate());
    assert!(!private.locked() && !private.noreserve() && !private.hugetlb());
    assert_eq!(f(libc::MAP_SHARED).sharing(), Sharing::Shared);
    assert_eq!(f(libc::MAP_SHARED_VALIDATE).sharing(), Sharing::Shared);
    // MAP_FIXED_NOREPLACE wins over MAP_FIXED, as in do_mmap.
    let both = f(libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE);
    assert_eq!(both.placement(0x1000), Placement::FixedNoReplace(0x1000));
    assert_eq!(
        f(libc::MAP_FIXED).placement(0x2000),
        Placement::Fixed(0x2000)
    );
    assert_eq!(f(0).placement(0x3000), Placement::Hint(0x3000));
    assert_eq!(f(0).placement(0), Placement::Any);
    // A recorded call that succeeded is replayed where the host put it.
    assert_eq!(trace::placed_at(f(0), 0, 0x7000), Placement::Fixed(0x7000));
    assert_eq!(trace::placed_at(f(0), 0x5000, -12), Placement::Hint(0x5000));
}

#[test]
fn mremap_and_mlockall_flags_decode() {
    let m = MremapFlags::from_bits(bits(libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED), 0x9000);
    assert!(m.maymove && !m.dontunmap);
    assert_eq!(m.fixed, Some(0x9000));
    let d = MremapFlags::from_bits(bits(libc::MREMAP_MAYMOVE | libc::MREMAP_DONTUNMAP), 0x9000);
    assert!(d.maymove && d.dontunmap && d.fixed.is_none());
    let l = MlockallFlags::from_bits(bits(libc::MCL_CURRENT | libc::MCL_ONFAULT));
    assert!(l.current && l.onfault && !l.future);
    assert!(MlockallFlags::from_bits(bits(libc::MCL_FUTURE)).future);
}
