//! The MMU's and GUP's address check: a user access reaches a mapping only through the
//! address the hardware translates, so no alias of a page can outlive its `munmap`.
//!
//! x86-64 (4-level): an address with any of bits 63:47 set is a kernel or non-canonical
//! address, SIGSEGV for an access and EFAULT for GUP (`gup_fast_fallback`: the range must end
//! at or below `TASK_SIZE_MAX`). arm64: the top byte is a tag the MMU ignores (TBI0), GUP
//! untags it; bits 55:48 set fault. Each case checks the bytes, the signal or errno, and that
//! the freed frame cannot be read through any alias after `munmap`.

mod common;
use common::*;
use usermm::{Arch, Errno, Machine, MachineConfig, MmapArgs, Placement, Privilege, Signal};

const A: u64 = 0x1000_0000;

fn machine_for(arch: Arch) -> Machine {
    let mut cfg = MachineConfig {
        memory: 64 * M,
        arch,
        ..MachineConfig::default()
    };
    cfg.tunables.check_tlb = true;
    Machine::new(cfg)
}

/// A process with 64 KiB at `A` filled with 0x5a.
fn mapped(m: &Machine) -> (usermm::Cpu<'_>, usermm::Pid) {
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).expect("spawn");
    let args = MmapArgs {
        placement: Placement::Fixed(A),
        ..MmapArgs::anon(64 * K, RW)
    };
    assert_eq!(cpu.mmap(p, args).expect("mmap"), A);
    cpu.write_fill(p, A, 64 * K, 0x5a).expect("write");
    valid(m);
    (cpu, p)
}

fn read1(cpu: &usermm::Cpu<'_>, p: usermm::Pid, addr: u64) -> Result<u8, Signal> {
    let mut b = [0u8; 1];
    cpu.read_bytes(p, addr, &mut b).map(|()| b[0])
}

/// Aliases of `A` a 4-level x86-64 MMU refuses: non-canonical, and canonical kernel-half.
const X86_ALIASES: [u64; 5] = [
    0x1000_0000_1000_0000,
    0x8000_0000_1000_0000,
    0xfff0_0000_1000_0000,
    0x0000_8000_1000_0000,
    0xffff_8000_1000_0000,
];

#[test]
fn x86_non_canonical_and_kernel_addresses_are_sigsegv_and_efault() {
    let m = machine_for(Arch::X86_64);
    let (cpu, p) = mapped(&m);
    for alias in X86_ALIASES {
        assert_eq!(
            read1(&cpu, p, alias),
            Err(Signal::Segv(alias)),
            "{alias:#x}"
        );
        assert_eq!(
            cpu.write_fill(p, alias, 1, 0x11),
            Err(Signal::Segv(alias)),
            "{alias:#x}"
        );
        assert_eq!(cpu.pin(p, alias, 4096), Err(Errno::EFAULT), "{alias:#x}");
        valid(&m);
    }
    // The write through an alias changed nothing; the real address still reads its bytes.
    assert_eq!(read1(&cpu, p, A), Ok(0x5a));
    // A range that starts below the top but ends past it is refused whole.
    assert_eq!(cpu.pin(p, (1 << 47) - 4096, 8192), Err(Errno::EFAULT));
    cpu.munmap(p, A, 64 * K).expect("munmap");
    valid(&m);
    assert_eq!(read1(&cpu, p, A), Err(Signal::Segv(A)));
    for alias in X86_ALIASES {
        assert_eq!(
            read1(&cpu, p, alias),
            Err(Signal::Segv(alias)),
            "{alias:#x}"
        );
    }
}

#[test]
fn arm64_top_byte_is_ignored_and_flushed_with_its_address() {
    let m = machine_for(Arch::Arm64);
    let (cpu, p) = mapped(&m);
    let tagged = 0x5a00_0000_0000_0000 | A;
    // TBI: the tagged pointer is the same page, through the same TLB entry.
    assert_eq!(read1(&cpu, p, tagged), Ok(0x5a));
    cpu.write_fill(p, tagged + 4096, 1, 0x22)
        .expect("tagged write");
    assert_eq!(read1(&cpu, p, A + 4096), Ok(0x22));
    // GUP untags: the pin is of the page at A, and releases as it was taken.
    cpu.pin(p, tagged, 4096).expect("tagged pin");
    valid(&m);
    cpu.unpin(p, A, 4096).expect("unpin the untagged range");
    valid(&m);
    // Bits 55:48 are not a tag: bit 55 selects the kernel's tables, 54:48 are out of range.
    for bad in [
        0x0080_0000_1000_0000u64,
        0x0001_0000_1000_0000,
        0x5a10_0000_1000_0000,
    ] {
        assert_eq!(read1(&cpu, p, bad), Err(Signal::Segv(bad)), "{bad:#x}");
        assert_eq!(cpu.pin(p, bad, 4096), Err(Errno::EFAULT), "{bad:#x}");
    }
    cpu.munmap(p, A, 64 * K).expect("munmap");
    valid(&m);
    // The tagged alias was flushed with the page it stood for: the freed frame is gone.
    assert_eq!(read1(&cpu, p, tagged), Err(Signal::Segv(tagged)));
    assert_eq!(read1(&cpu, p, A), Err(Signal::Segv(A)));
}
