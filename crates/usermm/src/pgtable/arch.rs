//! Page-table entry codecs: x86-64 and arm64 (4 KiB granule), with the real bit positions.
//!
//! Linux counterparts: `arch/x86/include/asm/pgtable_types.h`, `arch/x86/include/asm/pgtable.h`
//! (including the L1TF inversion of non-present PFNs), `arch/arm64/include/asm/pgtable-hwdef.h`,
//! `pgtable-prot.h` and `pgtable.h` (the DBM/RDONLY/software-dirty encoding). Entries are the
//! typed words of [`super::entry`]; [`Arch`] interprets and builds them. Batch code compares
//! *normalised* values, never raw bit masks, because on arm64 "writable clean" is DBM=1
//! RDONLY=1.

use super::entry::{LeafEntry, LeafLevel, Pmd, Pte, TableEntry};
use crate::phys::{Pfn, SwpEntry};

/// The kind of memory access the MMU checks an entry against (a load or a store), and that
/// faults when the entry forbids it (`FAULT_FLAG_WRITE` set or not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// A load.
    Read,
    /// A store.
    Write,
}

/// A user-visible protection, the `vm_page_prot` of a VMA.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Prot {
    /// Readable.
    pub read: bool,
    /// Writable (in the PTE: only once the page is exclusive).
    pub write: bool,
    /// Executable.
    pub exec: bool,
}

impl Prot {
    /// PROT_NONE.
    pub const NONE: Prot = Prot::from_bits(0);
    /// PROT_READ.
    pub const RO: Prot = Prot::from_bits(1);
    /// PROT_READ | PROT_WRITE.
    pub const RW: Prot = Prot::from_bits(3);

    /// The protection of `mmap(2)`'s `PROT_*` bits (READ 1, WRITE 2, EXEC 4; other bits are
    /// not protections and are left out): the workspace's one conversion from the ABI.
    pub const fn from_bits(bits: u32) -> Prot {
        Prot {
            read: bits & 1 != 0,
            write: bits & 2 != 0,
            exec: bits & 4 != 0,
        }
    }

    /// The `PROT_*` bits (READ 1, WRITE 2, EXEC 4).
    pub const fn bits(self) -> u32 {
        self.read as u32 | (self.write as u32) << 1 | (self.exec as u32) << 2
    }

    /// Whether this is PROT_NONE.
    pub(crate) fn is_none(self) -> bool {
        !self.read && !self.write && !self.exec
    }
}

/// Page-table format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// x86-64 4-level paging.
    X86_64,
    /// arm64, 4 KiB granule, 48-bit VA (4 levels).
    Arm64,
}

/// x86-64 bit positions.
pub(crate) mod x86 {
    #![allow(missing_docs)]
    pub(crate) const P: u64 = 1 << 0;
    pub(crate) const RW: u64 = 1 << 1;
    pub(crate) const US: u64 = 1 << 2;
    #[allow(dead_code)] // No caller left since the public surface was narrowed (h14).
    pub(crate) const PWT: u64 = 1 << 3;
    #[allow(dead_code)] // No caller left since the public surface was narrowed (h14).
    pub(crate) const PCD: u64 = 1 << 4;
    pub(crate) const A: u64 = 1 << 5;
    pub(crate) const D: u64 = 1 << 6;
    pub(crate) const PS: u64 = 1 << 7;
    pub(crate) const G: u64 = 1 << 8;
    /// `G` reused as PROT_NONE marker when P is clear.
    pub(crate) const PROTNONE: u64 = G;
    pub(crate) const SPECIAL: u64 = 1 << 9;
    pub(crate) const UFFD_WP: u64 = 1 << 10;
    pub(crate) const SOFT_DIRTY: u64 = 1 << 11;
    pub(crate) const PFN_MASK: u64 = ((1 << 52) - 1) & !((1 << 12) - 1);
    pub(crate) const NX: u64 = 1 << 63;
    /// Upper-level table entry for user tables (`_PAGE_TABLE`).
    pub(crate) const TABLE: u64 = P | RW | US | A | D;
}

/// arm64 bit positions (stage 1, 4 KiB granule).
/// arm64's `PTE_SWP_EXCLUSIVE` (bit 2 of a non-present entry).
const SWP_EXCLUSIVE_ARM64: u64 = 1 << 2;

pub(crate) mod arm64 {
    #![allow(missing_docs)]
    pub(crate) const VALID: u64 = 1 << 0;
    /// Level 3: page descriptor; levels 0–2: table (set) or block (clear).
    pub(crate) const TYPE: u64 = 1 << 1;
    pub(crate) const ATTRINDX_MASK: u64 = 7 << 2;
    pub(crate) const USER: u64 = 1 << 6;
    pub(crate) const RDONLY: u64 = 1 << 7;
    pub(crate) const SH_INNER: u64 = 3 << 8;
    pub(crate) const AF: u64 = 1 << 10;
    pub(crate) const NG: u64 = 1 << 11;
    /// `nG` reused as "present but invalid" (PROT_NONE) when VALID is clear.
    pub(crate) const PRESENT_INVALID: u64 = NG;
    pub(crate) const OA_MASK: u64 = ((1 << 48) - 1) & !((1 << 12) - 1);
    #[allow(dead_code)] // No caller left since the public surface was narrowed (h14).
    pub(crate) const GP: u64 = 1 << 50;
    /// DBM, used as the software "writable" bit.
    pub(crate) const WRITE: u64 = 1 << 51;
    pub(crate) const CONT: u64 = 1 << 52;
    pub(crate) const PXN: u64 = 1 << 53;
    pub(crate) const UXN: u64 = 1 << 54;
    pub(crate) const DIRTY: u64 = 1 << 55;
    pub(crate) const SPECIAL: u64 = 1 << 56;
    pub(crate) const UFFD_WP: u64 = 1 << 58;
    /// Upper-level table descriptor.
    pub(crate) const TABLE: u64 = VALID | TYPE;
}

impl Arch {
    /// The address a user-mode access to `addr` is translated at, or `None` when the CPU
    /// faults before reading any table (the access is a SIGSEGV).
    ///
    /// x86-64 (4-level): the user half is `[0, 2^47)`; an address with bits 63:47 not all
    /// clear is a kernel address (a page fault on a supervisor page) or non-canonical (a
    /// general-protection fault): both are SIGSEGV for the process. arm64: Linux enables
    /// top-byte-ignore for EL0 (`TCR_EL1.TBI0`), so bits 63:56 are a tag the MMU and its TLB
    /// disregard; of the rest, bit 55 selects the kernel's table and bits 54:48 set are
    /// outside the 48-bit input range: both fault. The result is what the TLB is keyed by,
    /// so an alias can never outlive the flush of the address it stands for.
    #[inline]
    pub(crate) fn user_va(self, addr: u64) -> Option<u64> {
        let va = match self {
            Arch::X86_64 => addr,
            Arch::Arm64 => addr & ((1 << 56) - 1),
        };
        (va < self.user_va_limit()).then_some(va)
    }

    /// `untagged_addr` as GUP applies it to a user pointer: arm64 sign-extends bit 55 over
    /// the tag byte (a tagged user pointer becomes its untagged address, a pointer with bit 55
    /// set a kernel one); x86-64 without LAM leaves the pointer as it is.
    #[inline]
    pub(crate) fn untagged_addr(self, addr: u64) -> u64 {
        match self {
            Arch::X86_64 => addr,
            Arch::Arm64 => (((addr << 8) as i64) >> 8) as u64,
        }
    }

    /// One past the highest user address the MMU translates (`2^47` on x86-64 4-level,
    /// `2^48` with arm64's 48-bit VA).
    #[inline]
    pub(crate) fn user_va_limit(self) -> u64 {
        match self {
            Arch::X86_64 => 1 << 47,
            Arch::Arm64 => 1 << 48,
        }
    }

    /// `pfn_pte`: a present PTE for page `pfn` with `prot`, clean and young (as Linux's
    /// `vm_page_prot` includes the accessed bit).
    #[inline]
    pub(crate) fn mk_pte(self, pfn: Pfn, prot: Prot) -> Pte {
        Pte::from_val(self.leaf_bits(pfn, prot, LeafLevel::Pte))
    }

    /// `pfn_pmd` + `pmd_mkhuge`: a present 2 MiB PMD leaf for the folio at `pfn` with `prot`,
    /// clean and young like [`Arch::mk_pte`].
    #[inline]
    pub(crate) fn mk_pmd_leaf(self, pfn: Pfn, prot: Prot) -> Pmd {
        Pmd::from_val(self.leaf_bits(pfn, prot, LeafLevel::Pmd))
    }

    /// The bits of a leaf at `level`: the two formats differ only in the x86 `PS` bit and the
    /// arm64 descriptor type (page vs block). `level` is a constant wherever the entry's type
    /// is [`Pte`] or [`Pmd`], so each such call compiles to one format.
    #[inline]
    fn leaf_bits(self, pfn: Pfn, prot: Prot, level: LeafLevel) -> u64 {
        let huge = level == LeafLevel::Pmd;
        match self {
            Arch::X86_64 => {
                let pa = (pfn.val() << 12) & x86::PFN_MASK;
                let ps = if huge { x86::PS } else { 0 };
                if prot.is_none() {
                    // L1TF: a non-present entry stores its PFN inverted.
                    return (!pa & x86::PFN_MASK) | x86::PROTNONE | x86::A | ps;
                }
                let mut v = pa | x86::P | x86::US | x86::A | ps;
                if prot.write {
                    v |= x86::RW;
                }
                if !prot.exec {
                    v |= x86::NX;
                }
                v
            }
            Arch::Arm64 => {
                let oa = (pfn.val() << 12) & arm64::OA_MASK;
                let ty = if huge { 0 } else { arm64::TYPE };
                let base =
                    oa | ty | arm64::SH_INNER | arm64::AF | arm64::NG | arm64::RDONLY | arm64::PXN;
                if prot.is_none() {
                    return base | arm64::PRESENT_INVALID | arm64::UXN;
                }
                let mut v = base | arm64::VALID | arm64::USER;
                if prot.write {
                    v |= arm64::WRITE;
                }
                if !prot.exec {
                    v |= arm64::UXN;
                }
                v
            }
        }
    }

    /// `p?d_populate`'s entry: a PMD, PUD or PGD entry pointing at the table page `pfn`.
    #[inline]
    pub(crate) fn mk_table<E: TableEntry>(self, pfn: Pfn) -> E {
        E::from_val(match self {
            Arch::X86_64 => (pfn.val() << 12) | x86::TABLE,
            Arch::Arm64 => (pfn.val() << 12) | arm64::TABLE,
        })
    }

    /// Whether a PMD, PUD or PGD entry points at a table (as opposed to none or a leaf).
    #[inline]
    pub(crate) fn is_table<E: TableEntry>(self, e: E) -> bool {
        let e = e.val();
        match self {
            Arch::X86_64 => e & x86::P != 0 && e & x86::PS == 0,
            Arch::Arm64 => e & (arm64::VALID | arm64::TYPE) == arm64::TABLE,
        }
    }

    /// Whether a PMD entry is a present (possibly PROT_NONE) huge leaf.
    #[inline]
    pub(crate) fn is_pmd_leaf(self, e: Pmd) -> bool {
        match self {
            Arch::X86_64 => e.val() & x86::PS != 0 && self.present(e),
            Arch::Arm64 => e.val() & arm64::TYPE == 0 && self.present(e),
        }
    }

    /// The frame of the table a table entry points at (`pmd_pfn` of a table entry).
    #[inline]
    pub(crate) fn table_pfn<E: TableEntry>(self, e: E) -> Pfn {
        let e = e.val();
        Pfn::new(match self {
            Arch::X86_64 => (e & x86::PFN_MASK) >> 12,
            Arch::Arm64 => (e & arm64::OA_MASK) >> 12,
        })
    }

    /// `pte_present`: mapped, including PROT_NONE entries.
    #[inline]
    pub(crate) fn present<E: LeafEntry>(self, e: E) -> bool {
        let e = e.val();
        match self {
            Arch::X86_64 => e & (x86::P | x86::PROTNONE) != 0,
            Arch::Arm64 => e & (arm64::VALID | arm64::PRESENT_INVALID) != 0,
        }
    }

    /// `swp_entry_to_pte` (with `pte_swp_mkexclusive` when `exclusive`): the non-present PTE
    /// of a swapped-out page. The slot sits in the PFN field, the valid and PROT_NONE bits
    /// stay clear, and PageAnonExclusive is kept in a software bit as Linux keeps it
    /// (x86 `_PAGE_SWP_EXCLUSIVE` is the PWT bit, arm64 `PTE_SWP_EXCLUSIVE` bit 2).
    /// Deliberate difference: x86 stores the offset inverted (the L1TF mitigation), the
    /// engine does not need to.
    #[inline]
    pub(crate) fn mk_swap_pte(self, entry: SwpEntry, exclusive: bool) -> Pte {
        debug_assert!(entry.offset() != 0 && entry.offset() < 1 << 36);
        let excl = match (self, exclusive) {
            (_, false) => 0,
            (Arch::X86_64, true) => x86::PWT,
            (Arch::Arm64, true) => SWP_EXCLUSIVE_ARM64,
        };
        Pte::from_val(entry.offset() << 12 | excl)
    }

    /// `is_swap_pte`: neither empty nor present.
    #[inline]
    pub(crate) fn is_swap_pte(self, e: Pte) -> bool {
        !e.is_none() && !self.present(e)
    }

    /// `pte_to_swp_entry` of a swap PTE.
    #[inline]
    pub(crate) fn swp_entry(self, e: Pte) -> SwpEntry {
        debug_assert!(self.is_swap_pte(e));
        SwpEntry::new((e.val() >> 12) & ((1 << 36) - 1))
    }

    /// `pte_swp_exclusive`.
    #[inline]
    pub(crate) fn swp_exclusive(self, e: Pte) -> bool {
        e.val()
            & match self {
                Arch::X86_64 => x86::PWT,
                Arch::Arm64 => SWP_EXCLUSIVE_ARM64,
            }
            != 0
    }

    /// `pte_swp_clear_exclusive`.
    #[inline]
    pub(crate) fn swp_clear_exclusive(self, e: Pte) -> Pte {
        Pte::from_val(e.val() & !(x86::PWT | SWP_EXCLUSIVE_ARM64))
    }

    /// Whether the hardware may access through this entry (present and not PROT_NONE).
    #[inline]
    pub(crate) fn accessible<E: LeafEntry>(self, e: E) -> bool {
        let e = e.val();
        match self {
            Arch::X86_64 => e & x86::P != 0,
            Arch::Arm64 => e & arm64::VALID != 0,
        }
    }

    /// `pte_pfn`.
    #[inline]
    pub(crate) fn pfn<E: LeafEntry>(self, e: E) -> Pfn {
        let e = e.val();
        Pfn::new(match self {
            Arch::X86_64 => {
                let v = if e != 0 && e & x86::P == 0 {
                    e ^ x86::PFN_MASK
                } else {
                    e
                };
                (v & x86::PFN_MASK) >> 12
            }
            Arch::Arm64 => (e & arm64::OA_MASK) >> 12,
        })
    }

    /// `pte_exec`: user mode may execute through the entry as far as its no-execute bit says
    /// (x86 `NX`, arm64 `UXN`; PROT_NONE is a separate question, [`Arch::accessible`]).
    #[inline]
    pub(crate) fn exec<E: LeafEntry>(self, e: E) -> bool {
        let e = e.val();
        match self {
            Arch::X86_64 => e & x86::NX == 0,
            Arch::Arm64 => e & arm64::UXN == 0,
        }
    }

    /// `pte_write`.
    #[inline]
    pub(crate) fn write<E: LeafEntry>(self, e: E) -> bool {
        let e = e.val();
        match self {
            Arch::X86_64 => e & x86::RW != 0,
            Arch::Arm64 => e & arm64::WRITE != 0,
        }
    }

    /// `pte_dirty` (hardware or software dirty).
    #[inline]
    pub(crate) fn dirty<E: LeafEntry>(self, e: E) -> bool {
        let e = e.val();
        match self {
            Arch::X86_64 => e & x86::D != 0,
            Arch::Arm64 => {
                e & arm64::DIRTY != 0 || (e & arm64::WRITE != 0 && e & arm64::RDONLY == 0)
            }
        }
    }

    /// `pte_young`.
    #[inline]
    pub(crate) fn young<E: LeafEntry>(self, e: E) -> bool {
        let e = e.val();
        match self {
            Arch::X86_64 => e & x86::A != 0,
            Arch::Arm64 => e & arm64::AF != 0,
        }
    }

    /// `pte_special` (no struct page behind it: zero page, pfn maps).
    #[inline]
    pub(crate) fn special<E: LeafEntry>(self, e: E) -> bool {
        let e = e.val();
        match self {
            Arch::X86_64 => e & x86::SPECIAL != 0,
            Arch::Arm64 => e & arm64::SPECIAL != 0,
        }
    }

    /// `pte_soft_dirty` (always false on arm64).
    #[inline]
    pub(crate) fn soft_dirty<E: LeafEntry>(self, e: E) -> bool {
        let e = e.val();
        match self {
            Arch::X86_64 => e & x86::SOFT_DIRTY != 0,
            Arch::Arm64 => false,
        }
    }

    /// `pte_uffd_wp`.
    #[inline]
    pub(crate) fn uffd_wp<E: LeafEntry>(self, e: E) -> bool {
        let e = e.val();
        match self {
            Arch::X86_64 => e & x86::UFFD_WP != 0,
            Arch::Arm64 => e & arm64::UFFD_WP != 0,
        }
    }

    /// `pte_mkwrite`.
    #[inline]
    pub(crate) fn mkwrite<E: LeafEntry>(self, e_in: E) -> E {
        let e = e_in.val();
        e_in.with_val(match self {
            Arch::X86_64 => e | x86::RW,
            Arch::Arm64 => {
                let v = e | arm64::WRITE;
                if v & arm64::DIRTY != 0 {
                    v & !arm64::RDONLY
                } else {
                    v
                }
            }
        })
    }

    /// `pte_wrprotect` (keeps dirtiness).
    #[inline]
    pub(crate) fn wrprotect<E: LeafEntry>(self, e_in: E) -> E {
        let e = e_in.val();
        e_in.with_val(match self {
            Arch::X86_64 => e & !x86::RW,
            Arch::Arm64 => {
                let v = if self.dirty(e_in) {
                    e | arm64::DIRTY
                } else {
                    e
                };
                (v & !arm64::WRITE) | arm64::RDONLY
            }
        })
    }

    /// `pte_mkdirty` (x86 also sets soft-dirty, as Linux does).
    #[inline]
    pub(crate) fn mkdirty<E: LeafEntry>(self, e_in: E) -> E {
        let e = e_in.val();
        e_in.with_val(match self {
            Arch::X86_64 => e | x86::D | x86::SOFT_DIRTY,
            Arch::Arm64 => {
                let v = e | arm64::DIRTY;
                if v & arm64::WRITE != 0 {
                    v & !arm64::RDONLY
                } else {
                    v
                }
            }
        })
    }

    /// `pte_mkclean`.
    #[inline]
    pub(crate) fn mkclean<E: LeafEntry>(self, e_in: E) -> E {
        let e = e_in.val();
        e_in.with_val(match self {
            Arch::X86_64 => e & !x86::D,
            Arch::Arm64 => (e & !arm64::DIRTY) | arm64::RDONLY,
        })
    }

    /// `pte_mkold`.
    #[inline]
    pub(crate) fn mkold<E: LeafEntry>(self, e_in: E) -> E {
        let e = e_in.val();
        e_in.with_val(match self {
            Arch::X86_64 => e & !x86::A,
            Arch::Arm64 => e & !arm64::AF,
        })
    }

    /// `pte_mkyoung`.
    #[inline]
    pub(crate) fn mkyoung<E: LeafEntry>(self, e_in: E) -> E {
        let e = e_in.val();
        e_in.with_val(match self {
            Arch::X86_64 => e | x86::A,
            Arch::Arm64 => e | arm64::AF,
        })
    }

    /// `pte_mkspecial`.
    #[inline]
    pub(crate) fn mkspecial<E: LeafEntry>(self, e_in: E) -> E {
        let e = e_in.val();
        e_in.with_val(match self {
            Arch::X86_64 => e | x86::SPECIAL,
            Arch::Arm64 => e | arm64::SPECIAL,
        })
    }

    /// `pte_clear_uffd_wp`.
    #[inline]
    pub(crate) fn clear_uffd_wp<E: LeafEntry>(self, e_in: E) -> E {
        let e = e_in.val();
        e_in.with_val(match self {
            Arch::X86_64 => e & !x86::UFFD_WP,
            Arch::Arm64 => e & !arm64::UFFD_WP,
        })
    }

    /// `pte_clear_soft_dirty`.
    #[inline]
    pub(crate) fn clear_soft_dirty<E: LeafEntry>(self, e_in: E) -> E {
        let e = e_in.val();
        e_in.with_val(match self {
            Arch::X86_64 => e & !x86::SOFT_DIRTY,
            Arch::Arm64 => e,
        })
    }

    /// `pte_advance_pfn`: the same entry for the page `n` frames further (x86 subtracts for
    /// inverted non-present entries).
    #[inline]
    pub(crate) fn advance_pfn(self, e: Pte, n: u64) -> Pte {
        let e = e.val();
        Pte::from_val(match self {
            Arch::X86_64 if e & x86::P == 0 => e.wrapping_sub(n << 12),
            _ => e.wrapping_add(n << 12),
        })
    }

    /// `pte_modify` / `pmd_modify`: keep PFN, A/D, special and software bits; take
    /// permissions from `prot`. The result is a leaf of the same level as `e`.
    pub(crate) fn modify<E: LeafEntry>(self, e: E, prot: Prot) -> E {
        let pfn = self.pfn(e);
        let mut v = e.with_val(self.leaf_bits(pfn, prot, e.level()));
        if !self.young(e) {
            v = self.mkold(v);
        }
        if self.dirty(e) {
            v = self.mkdirty(v);
            if !self.soft_dirty(e) {
                v = self.clear_soft_dirty(v);
            }
        }
        if self.special(e) {
            v = self.mkspecial(v);
        }
        if self.soft_dirty(e) {
            v = v.with_val(
                v.val()
                    | match self {
                        Arch::X86_64 => x86::SOFT_DIRTY,
                        Arch::Arm64 => 0,
                    },
            );
        }
        if self.uffd_wp(e) {
            v = v.with_val(
                v.val()
                    | match self {
                        Arch::X86_64 => x86::UFFD_WP,
                        Arch::Arm64 => arm64::UFFD_WP,
                    },
            );
        }
        v
    }

    /// The access/dirty update a hardware walker makes on an access (x86 sets A and, on a
    /// write, D; arm64 with HAFDBS sets AF and, on a write, clears RDONLY).
    #[inline]
    pub(crate) fn hw_access<E: LeafEntry>(self, e_in: E, access: Access) -> E {
        let write = access == Access::Write;
        let e = e_in.val();
        e_in.with_val(match self {
            Arch::X86_64 => e | x86::A | if write { x86::D } else { 0 },
            Arch::Arm64 => {
                let v = e | arm64::AF;
                if write {
                    v & !arm64::RDONLY
                } else {
                    v
                }
            }
        })
    }

    /// Whether the hardware allows a write through this entry without a fault.
    #[inline]
    pub(crate) fn hw_writable<E: LeafEntry>(self, e: E) -> bool {
        self.accessible(e) && self.write(e)
    }

    /// Whether user mode may read through this entry.
    #[inline]
    pub(crate) fn hw_user_readable<E: LeafEntry>(self, e: E) -> bool {
        let e = e.val();
        match self {
            Arch::X86_64 => e & x86::P != 0 && e & x86::US != 0,
            Arch::Arm64 => e & arm64::VALID != 0 && e & arm64::USER != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RW: Prot = Prot::RW;
    const RO: Prot = Prot::RO;

    #[test]
    fn x86_bits_are_at_linux_positions() {
        let e = Arch::X86_64.mk_pte(Pfn::new(0x1234), RW);
        assert_eq!(
            e.val(),
            0x1234 << 12 | x86::P | x86::RW | x86::US | x86::A | x86::NX
        );
        assert_eq!(Arch::X86_64.pfn(e), Pfn::new(0x1234));
        let d = Arch::X86_64.mkdirty(e);
        assert!(
            d.val() & (1 << 6) != 0 && d.val() & (1 << 11) != 0,
            "D and soft-dirty"
        );
    }

    #[test]
    fn x86_protnone_inverts_pfn_and_advances_downwards() {
        let e = Arch::X86_64.mk_pte(Pfn::new(0x1234), Prot::NONE);
        assert_eq!(e.val() & x86::P, 0);
        assert!(Arch::X86_64.present(e));
        assert!(!Arch::X86_64.accessible(e));
        assert_eq!(Arch::X86_64.pfn(e), Pfn::new(0x1234));
        assert_eq!(
            Arch::X86_64.pfn(Arch::X86_64.advance_pfn(e, 3)),
            Pfn::new(0x1237)
        );
    }

    #[test]
    fn arm64_dirty_truth_table() {
        let a = Arch::Arm64;
        let clean_w = a.mk_pte(Pfn::new(7), RW);
        assert!(a.write(clean_w) && !a.dirty(clean_w));
        assert!(
            clean_w.val() & arm64::RDONLY != 0,
            "writable clean is DBM=1 RDONLY=1"
        );
        let hw_dirty = a.hw_access(clean_w, Access::Write);
        assert!(a.dirty(hw_dirty) && hw_dirty.val() & arm64::DIRTY == 0);
        let wp = a.wrprotect(hw_dirty);
        assert!(
            !a.write(wp) && a.dirty(wp) && wp.val() & arm64::DIRTY != 0,
            "wrprotect keeps dirtiness in sw bit"
        );
        let rw_again = a.mkwrite(wp);
        assert!(
            rw_again.val() & arm64::RDONLY == 0,
            "mkwrite of sw-dirty clears RDONLY"
        );
        let clean = a.mkclean(rw_again);
        assert!(!a.dirty(clean) && a.write(clean));
        let ro = a.mk_pte(Pfn::new(7), RO);
        assert!(!a.write(a.mkdirty(ro)) && a.dirty(a.mkdirty(ro)));
    }

    #[test]
    fn tables_and_huge_leaves_are_distinguished() {
        for a in [Arch::X86_64, Arch::Arm64] {
            let t: Pmd = a.mk_table(Pfn::new(99));
            assert!(a.is_table(t) && !a.is_pmd_leaf(t));
            assert_eq!(a.table_pfn(t), Pfn::new(99));
            let h = a.mk_pmd_leaf(Pfn::new(512), RW);
            assert!(a.is_pmd_leaf(h) && !a.is_table(h));
            assert_eq!(a.pfn(h), Pfn::new(512));
        }
    }

    #[test]
    fn modify_keeps_pfn_and_dirty() {
        for a in [Arch::X86_64, Arch::Arm64] {
            let e = a.mkdirty(a.mk_pte(Pfn::new(42), RW));
            let n = a.modify(e, Prot::NONE);
            assert!(a.present(n) && !a.accessible(n) && a.pfn(n) == Pfn::new(42) && a.dirty(n));
            let back = a.modify(n, RO);
            assert!(
                a.accessible(back)
                    && !a.write(back)
                    && a.dirty(back)
                    && a.pfn(back) == Pfn::new(42)
            );
            let h = a.modify(a.mkdirty(a.mk_pmd_leaf(Pfn::new(512), RW)), RO);
            assert!(a.is_pmd_leaf(h) && !a.write(h) && a.dirty(h) && a.pfn(h) == Pfn::new(512));
            assert_eq!(
                a.modify(a.mk_pte(Pfn::new(512), RW), RO).val() & !(arm64::TYPE | x86::PS),
                a.modify(a.mk_pmd_leaf(Pfn::new(512), RW), RO).val() & !(arm64::TYPE | x86::PS),
                "the PTE and PMD leaf formats differ only in the level bit"
            );
        }
    }
}

#[cfg(test)]
mod prot_bits {
    use super::Prot;

    #[test]
    fn every_combination_round_trips() {
        for bits in 0..8u32 {
            let p = Prot::from_bits(bits);
            assert_eq!(p.bits(), bits);
            assert_eq!(
                (p.read, p.write, p.exec),
                (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0)
            );
        }
        assert_eq!(Prot::from_bits(0), Prot::NONE);
        // Bits that are not protections (PROT_GROWSDOWN 0x01000000) are left out.
        assert_eq!(Prot::from_bits(0x0100_0003).bits(), 3);
    }
}
