//! Typed page-table entry values: [`Pte`], [`Pmd`] and [`Pud`].
//!
//! Linux counterparts: `pte_t`, `pmd_t`, `pud_t` and `pgd_t` (`arch/*/include/asm/pgtable_types.h`,
//! `pgtable-types.h`), with `pte_val` / `__pte` (and the `pmd_`, `pud_` forms) to go between
//! an entry and its raw bits. A raw `u64` would name a PTE, a PMD leaf, a table pointer and a
//! PFN alike; the types keep them apart, so a PFN cannot be stored as an entry and a PMD leaf
//! cannot be handed to a function that expects a PTE. Each type is a `#[repr(transparent)]`
//! wrapper of the 64-bit word the table holds and compiles to the same code as the word.
//!
//! Deliberate difference: Linux picks the entry format at build time, so `pte_write(pte)` is
//! a free function of the entry. Here the format is chosen at run time ([`Arch`]), so the
//! accessors stay methods of [`Arch`] and take and return typed entries. Those that mean the
//! same for a PTE and a PMD leaf are generic over [`LeafEntry`] (one body, the types still
//! distinct: `arch.modify(pmd, prot)` returns a [`Pmd`]); those for table pointers are generic
//! over [`TableEntry`]. [`AnyLeaf`] is a leaf of either level, for the few walkers that treat
//! both alike.
//!
//! [`Pte`], [`Pmd`] and [`AnyLeaf`] are public so that the page-table dump
//! ([`Cpu::page_table_dump`](crate::Cpu::page_table_dump)) hands out typed entries; outside
//! the crate they can be read (raw bits, level, emptiness) but not built.
//!
//! [`Arch`]: super::Arch

use std::fmt;

/// Declares one entry type with its raw-bits constructors and a hex `Debug`.
macro_rules! entry_type {
    ($(#[$doc:meta])* $vis:vis $name:ident, $val:literal, $from:literal) => {
        $(#[$doc])*
        #[repr(transparent)]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
        $vis struct $name(u64);

        // Every type gets the whole set, as each Linux level has its `p?d_val`, `__p?d` and
        // `p?d_none`; [`Pud`] is built and read through the traits only (table pointers).
        #[allow(dead_code)]
        impl $name {
            /// The empty entry (all bits clear).
            pub(crate) const NONE: $name = $name(0);

            #[doc = concat!("The raw bits (`", $val, "`).")]
            #[inline]
            $vis const fn val(self) -> u64 {
                self.0
            }

            #[doc = concat!("The entry with raw bits `v` (`", $from, "`).")]
            #[inline]
            pub(crate) const fn from_val(v: u64) -> Self {
                $name(v)
            }

            /// Whether the entry is empty (`p?d_none`).
            #[inline]
            $vis const fn is_none(self) -> bool {
                self.0 == 0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:#x})"), self.0)
            }
        }

        impl Entry for $name {
            #[inline]
            fn val(self) -> u64 {
                self.0
            }

            #[inline]
            fn with_val(self, v: u64) -> Self {
                $name(v)
            }
        }
    };
}

entry_type!(
    /// A level-4 entry (`pte_t`): none, a present (possibly PROT_NONE) page, or a swap entry
    /// (not present, not none: [`SwpEntry`](crate::phys::SwpEntry)).
    pub Pte,
    "pte_val",
    "__pte"
);

entry_type!(
    /// A level-3 entry (`pmd_t`): none, a 2 MiB leaf, or a pointer to a PTE table.
    pub Pmd,
    "pmd_val",
    "__pmd"
);

entry_type!(
    /// An upper-level entry: a PUD entry (`pud_t`) or a PGD entry (`pgd_t`). The engine fills
    /// both levels only with table pointers (there are no 1 GiB leaves and no folded levels),
    /// and the two have the same table-pointer format on both architectures, so one type
    /// serves both.
    pub(crate) Pud,
    "pud_val",
    "__pud"
);

/// A leaf of either level, for the walkers that treat both alike (the MMU model in
/// `access.rs`, validation, the views and their public page-table dump): the codec reads and
/// updates it like a [`Pte`] or a [`Pmd`] (the flag bits sit at the same positions at both
/// levels), and an update keeps the level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum AnyLeaf {
    /// A level-4 entry.
    Pte(Pte),
    /// A PMD leaf.
    Pmd(Pmd),
}

impl AnyLeaf {
    /// The raw bits.
    #[inline]
    pub fn val(self) -> u64 {
        match self {
            AnyLeaf::Pte(e) => e.0,
            AnyLeaf::Pmd(e) => e.0,
        }
    }

    /// Whether this is a PMD leaf.
    #[inline]
    pub fn is_pmd(self) -> bool {
        matches!(self, AnyLeaf::Pmd(_))
    }
}

/// What every entry type is: a raw word. The generic accessors of [`Arch`](super::Arch) are
/// written over it and its two refinements, [`LeafEntry`] and [`TableEntry`].
pub(crate) trait Entry: Copy {
    /// The raw bits.
    fn val(self) -> u64;
    /// The same kind of entry (the same level, for an [`AnyLeaf`]) with raw bits `v`.
    fn with_val(self, v: u64) -> Self;
}

impl Entry for AnyLeaf {
    #[inline]
    fn val(self) -> u64 {
        AnyLeaf::val(self)
    }

    #[inline]
    fn with_val(self, v: u64) -> Self {
        match self {
            AnyLeaf::Pte(_) => AnyLeaf::Pte(Pte(v)),
            AnyLeaf::Pmd(_) => AnyLeaf::Pmd(Pmd(v)),
        }
    }
}

/// Which level a leaf entry sits at: the leaf formats differ in one bit (x86 `PS`, arm64
/// page vs block descriptor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeafLevel {
    /// A 4 KiB page (level 4).
    Pte,
    /// A 2 MiB block (level 3).
    Pmd,
}

/// An entry that can map memory: a [`Pte`], a [`Pmd`] leaf, or an [`AnyLeaf`].
pub(crate) trait LeafEntry: Entry {
    /// The level whose leaf format this entry uses (a constant for [`Pte`] and [`Pmd`]).
    fn level(self) -> LeafLevel;
}

impl LeafEntry for Pte {
    #[inline]
    fn level(self) -> LeafLevel {
        LeafLevel::Pte
    }
}

impl LeafEntry for Pmd {
    #[inline]
    fn level(self) -> LeafLevel {
        LeafLevel::Pmd
    }
}

impl LeafEntry for AnyLeaf {
    #[inline]
    fn level(self) -> LeafLevel {
        match self {
            AnyLeaf::Pte(_) => LeafLevel::Pte,
            AnyLeaf::Pmd(_) => LeafLevel::Pmd,
        }
    }
}

/// An entry that can point at a lower table: [`Pmd`] and [`Pud`].
pub(crate) trait TableEntry: Entry {
    /// The entry with raw bits `v`.
    fn from_val(v: u64) -> Self;
}

impl TableEntry for Pmd {
    #[inline]
    fn from_val(v: u64) -> Self {
        Pmd(v)
    }
}

impl TableEntry for Pud {
    #[inline]
    fn from_val(v: u64) -> Self {
        Pud(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_words_and_print_hex() {
        assert_eq!(std::mem::size_of::<Pte>(), 8);
        assert_eq!(std::mem::align_of::<Pmd>(), std::mem::align_of::<u64>());
        assert!(Pte::NONE.is_none() && Pte::default().is_none());
        assert_eq!(Pmd::from_val(0x2a).val(), 0x2a);
        assert_eq!(format!("{:?}", Pud::from_val(0x1003)), "Pud(0x1003)");
        let l = AnyLeaf::Pmd(Pmd::from_val(0x80));
        assert_eq!(l.with_val(0x81), AnyLeaf::Pmd(Pmd::from_val(0x81)));
        assert!(l.is_pmd() && l.level() == LeafLevel::Pmd && l.val() == 0x80);
    }
}
