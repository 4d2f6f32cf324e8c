//! The typed syntax tree of a scenario.
//!
//! Every keyword of the language is an enum implementing [`Keyword`]; sizes and
//! addresses are plain `u64` byte counts; names are [`Name`]s. Nothing here is a
//! string that the runner would have to parse again, except the NAME and VALUE of
//! `set tunable`, which belong to the engine.

/// A 1-based position in a scenario file (columns count characters, not bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Pos {
    /// Line, from 1.
    pub line: u32,
    /// Column, from 1.
    pub col: u32,
}

/// A parsed scenario file: its name and its statements, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    /// The file name given to [`crate::parse`], used in messages.
    pub file: String,
    /// The statements, in file order (comments and blank lines are dropped).
    pub stmts: Vec<Stmt>,
}

/// One statement with the position of its first token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stmt {
    /// Line and column of the statement's first token.
    pub pos: Pos,
    /// What the statement says.
    pub kind: StmtKind,
    /// `on cpuN`: the CPU a process statement runs on (`None`: cpu0).
    pub cpu: Option<u32>,
}

impl StmtKind {
    /// The process the statement acts on or observes, if any.
    pub fn task(&self) -> Option<&Name> {
        match self {
            StmtKind::Set(_) | StmtKind::Bench(_) => None,
            StmtKind::Action { action, .. } => action.task(),
            StmtKind::Expect(e) => e.task(),
            StmtKind::Dump { task, .. } => Some(task),
        }
    }
}

/// The three kinds of statements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StmtKind {
    /// `set ...` (or the shorthand `thp ...`): a machine or policy setting.
    Set(Setting),
    /// `[NAME =] ACTION`: an action, optionally binding its result to a name.
    ///
    /// Only [`Action::yields`] actions may bind: `spawn` and `fork` bind a process,
    /// `mmap` and `mremap` the returned address, `brk` the old break.
    Action {
        /// The name bound to the result, if any.
        bind: Option<Name>,
        /// The action.
        action: Action,
    },
    /// `expect ...`: a check.
    Expect(Expect),
    /// `dump TASK ADDR SIZE`: print the VMAs, page-table entries and folios of a range
    /// (engine only; the oracle lists it as skipped on the host).
    Dump {
        /// The process.
        task: Name,
        /// Start of the range.
        addr: AddrExpr,
        /// Length in bytes.
        len: u64,
    },
    /// `bench begin` / `bench end`: what `usermm bench scenario` times (a no-op when run).
    Bench(BenchMark),
}

/// An identifier naming a process or an address (`p0`, `child`, `a`).
///
/// Identifiers match `[A-Za-z_][A-Za-z0-9_]*` and are not one of the reserved
/// words [`Name::RESERVED`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(String);

impl Name {
    /// Words that start statements and so cannot be bound.
    pub const RESERVED: &'static [&'static str] = &["set", "thp", "expect", "spawn", "file"];

    /// A name, if `s` is a valid, non-reserved identifier.
    pub fn new(s: &str) -> Option<Name> {
        if is_ident(s) && !Name::RESERVED.contains(&s) {
            Some(Name(s.to_owned()))
        } else {
            None
        }
    }

    /// The identifier's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// True if `s` is an identifier: `[A-Za-z_][A-Za-z0-9_]*`.
pub(crate) fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The kind of value a name is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NameKind {
    /// A process (bound by `spawn` or `fork`).
    Process,
    /// An address (bound by `mmap`, `mremap` or `brk`); called a mapping.
    Mapping,
    /// A file (bound by `file`, v2).
    File,
}

/// An address expression: `NAME`, `NAME+SIZE`, `NAME-SIZE` or `0xHEX`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AddrExpr {
    /// An absolute address, written in hex.
    Abs(u64),
    /// An address relative to a bound name.
    Rel {
        /// The mapping name.
        base: Name,
        /// The offset from it (`a` alone is `Delta::Plus(0)`).
        delta: Delta,
    },
}

impl AddrExpr {
    /// The mapping name this expression refers to, if any.
    pub fn name(&self) -> Option<&Name> {
        match self {
            AddrExpr::Abs(_) => None,
            AddrExpr::Rel { base, .. } => Some(base),
        }
    }

    /// The address, given a way to look the name up; `None` if the name is unbound
    /// or the arithmetic leaves `0..2^64`.
    pub fn resolve(&self, lookup: impl FnOnce(&Name) -> Option<u64>) -> Option<u64> {
        match self {
            AddrExpr::Abs(a) => Some(*a),
            AddrExpr::Rel { base, delta } => delta.apply(lookup(base)?),
        }
    }
}

/// The signed offset of a relative address. Zero is always `Plus(0)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Delta {
    /// `NAME+SIZE`.
    Plus(u64),
    /// `NAME-SIZE` (never `Minus(0)`).
    Minus(u64),
}

impl Delta {
    /// `base` moved by this delta; `None` on overflow or underflow.
    pub fn apply(self, base: u64) -> Option<u64> {
        match self {
            Delta::Plus(d) => base.checked_add(d),
            Delta::Minus(d) => base.checked_sub(d),
        }
    }
}

/// A keyword enum: each variant is spelled by one word of the language.
pub trait Keyword: Sized + Copy + 'static {
    /// Every variant, in declaration order.
    const ALL: &'static [Self];
    /// The word spelling this variant.
    fn as_str(self) -> &'static str;
    /// The variant spelled by `word` (exact, case-sensitive).
    fn from_keyword(word: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|k| k.as_str() == word)
    }
    /// The words of all variants, separated by `|` (for messages).
    fn choices() -> String {
        let words: Vec<&str> = Self::ALL.iter().map(|k| k.as_str()).collect();
        words.join("|")
    }
}

/// Declares a keyword enum with its spelling, `Keyword` and `Display`.
macro_rules! keyword_enum {
    (
        $(#[$m:meta])*
        pub enum $T:ident {
            $( $(#[$vm:meta])* $V:ident = $s:literal, )+
        }
    ) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $T {
            $( $(#[$vm])* $V, )+
        }

        impl Keyword for $T {
            const ALL: &'static [Self] = &[ $( $T::$V, )+ ];
            fn as_str(self) -> &'static str {
                match self { $( $T::$V => $s, )+ }
            }
        }

        impl std::fmt::Display for $T {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

// ----------------------------------------------------------------------------
// Settings

/// A `set` statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting {
    /// `set memory SIZE`: size of simulated physical memory (non-zero; before the
    /// first `spawn`).
    Memory(u64),
    /// `set swap SIZE [ssd]`: a swap device of that size (v3; `0`: none, the default; before
    /// the first `spawn`); `ssd` makes it solid-state (large folios swapped whole; the
    /// default is rotational, as this host's disk).
    Swap(u64, bool),
    /// `set nodes N`: NUMA nodes, 1..=1024 (before the first `spawn`).
    Nodes(u32),
    /// `set cpus N`: CPUs, 1..=8192 (before the first `spawn`).
    Cpus(u32),
    /// `set arch x86_64|arm64`: page-table format (before the first `spawn`).
    Arch(Arch),
    /// `set tunable NAME=VALUE`: an engine switch, kept as text.
    Tunable {
        /// The tunable's name (no `=` and no whitespace).
        name: String,
        /// Its value (no whitespace; may contain `=`).
        value: String,
    },
    /// `set thp 64K=always top=madvise ...`: one or more THP policies, in order.
    Thp(Vec<ThpSetting>),
    /// `set rlimit memlock SIZE|unlimited`.
    Rlimit {
        /// The resource.
        resource: Resource,
        /// The new soft and hard limit.
        limit: Limit,
    },
    /// `set mempolicy interleave|default`.
    Mempolicy(Mempolicy),
    /// `set shmem 2M=always top=force ...`: the shmem_enabled knobs (v2), in order.
    Shmem(Vec<ShmemSetting>),
}

impl Setting {
    /// True for the settings that configure the machine itself (memory, nodes,
    /// cpus, arch), which must come before the first `spawn`.
    pub fn is_machine(&self) -> bool {
        matches!(
            self,
            Setting::Memory(_)
                | Setting::Swap(..)
                | Setting::Nodes(_)
                | Setting::Cpus(_)
                | Setting::Arch(_)
        )
    }
}

keyword_enum! {
    /// A page-table format.
    pub enum Arch {
        /// x86-64, 4-level.
        X86_64 = "x86_64",
        /// arm64, 4K granule.
        Arm64 = "arm64",
    }
}

/// One pair of `set thp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ThpSetting {
    /// `top=POLICY`: `/sys/kernel/mm/transparent_hugepage/enabled`.
    Top(ThpTop),
    /// `SIZE=POLICY`: `hugepages-<size>kB/enabled`.
    Size {
        /// The folio size.
        size: ThpSize,
        /// Its policy.
        policy: ThpPolicy,
    },
}

keyword_enum! {
    /// The top-level THP policy (`inherit` is not allowed there).
    pub enum ThpTop {
        /// Always use THP.
        Always = "always",
        /// Only in `madvise(MADV_HUGEPAGE)` regions.
        Madvise = "madvise",
        /// Never.
        Never = "never",
    }
}

keyword_enum! {
    /// The policy of one (m)THP size.
    pub enum ThpPolicy {
        /// Always use this size.
        Always = "always",
        /// Only in `madvise(MADV_HUGEPAGE)` regions.
        Madvise = "madvise",
        /// Never.
        Never = "never",
        /// Follow the top-level policy.
        Inherit = "inherit",
    }
}

/// A valid (m)THP size: a power of two from 16K to 2M.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ThpSize(u64);

impl ThpSize {
    /// Smallest mTHP size (order 2).
    pub const MIN: u64 = 16 << 10;
    /// Largest (PMD) size (order 9).
    pub const MAX: u64 = 2 << 20;

    /// The size, if `bytes` is a power of two in `MIN..=MAX`.
    pub fn new(bytes: u64) -> Option<ThpSize> {
        (bytes.is_power_of_two() && (Self::MIN..=Self::MAX).contains(&bytes))
            .then_some(ThpSize(bytes))
    }

    /// The size in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }

    /// The folio order with 4K base pages (2..=9).
    pub fn order(self) -> u32 {
        self.0.trailing_zeros().saturating_sub(12)
    }
}

/// One pair of `set shmem`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShmemSetting {
    /// `top=POLICY`: `/sys/kernel/mm/transparent_hugepage/shmem_enabled`.
    Top(ShmemTop),
    /// `SIZE=POLICY`: `hugepages-<size>kB/shmem_enabled`.
    Size {
        /// The folio size.
        size: ThpSize,
        /// Its policy.
        policy: ShmemPolicy,
    },
}

keyword_enum! {
    /// The top-level shmem_enabled policy.
    pub enum ShmemTop {
        /// Huge folios wherever they fit.
        Always = "always",
        /// Only where the folio lies within i_size.
        WithinSize = "within_size",
        /// Only in `madvise(MADV_HUGEPAGE)` regions.
        Advise = "advise",
        /// Never (the default).
        Never = "never",
        /// Never, for every shmem mount (emergency off).
        Deny = "deny",
        /// Always, for every shmem mount (testing).
        Force = "force",
    }
}

keyword_enum! {
    /// The shmem_enabled policy of one size.
    pub enum ShmemPolicy {
        /// Always.
        Always = "always",
        /// Follow the top-level policy.
        Inherit = "inherit",
        /// Only where the folio lies within i_size.
        WithinSize = "within_size",
        /// Only in `madvise(MADV_HUGEPAGE)` regions.
        Advise = "advise",
        /// Never.
        Never = "never",
    }
}

keyword_enum! {
    /// The mode of `msync`.
    pub enum MsyncMode {
        /// MS_SYNC.
        Sync = "sync",
        /// MS_ASYNC.
        Async = "async",
        /// MS_INVALIDATE.
        Invalidate = "invalidate",
    }
}

impl MsyncMode {
    /// The `MS_*` bit.
    pub fn bits(self) -> i32 {
        match self {
            MsyncMode::Async => 1,
            MsyncMode::Invalidate => 2,
            MsyncMode::Sync => 4,
        }
    }
}

/// Where a new file lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// The scenario's tmpfs (huge=never): the pages are the file.
    Tmpfs,
    /// A block-backed file system: a page cache over a device, with writeback.
    Disk,
}

keyword_enum! {
    /// A resource limit settable with `set rlimit`.
    pub enum Resource {
        /// RLIMIT_MEMLOCK.
        Memlock = "memlock",
    }
}

/// A resource limit value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    /// A limit in bytes.
    Bytes(u64),
    /// `unlimited` (RLIM_INFINITY).
    Unlimited,
}

keyword_enum! {
    /// The NUMA placement of newly faulted pages.
    pub enum Mempolicy {
        /// Local node (MPOL_DEFAULT).
        Default = "default",
        /// Round-robin over all nodes (MPOL_INTERLEAVE).
        Interleave = "interleave",
    }
}

mod action;
pub use action::Action;

/// The arguments of `mmap`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mmap {
    /// Length in bytes.
    pub len: u64,
    /// Protection.
    pub prot: Prot,
    /// MAP_PRIVATE or MAP_SHARED.
    pub sharing: Sharing,
    /// `anon` (MAP_ANONYMOUS) or `file NAME [offset SIZE]`.
    pub backing: Backing,
    /// MAP_POPULATE.
    pub populate: bool,
    /// MAP_LOCKED.
    pub locked: bool,
    /// MAP_NORESERVE (spelled `norserve`, as in SCENARIO.md, or `noreserve`).
    pub noreserve: bool,
    /// Where to place it (`fixed`, `noreplace`, `hint`: at most one).
    pub placement: Placement,
}

/// What an `mmap` maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// MAP_ANONYMOUS.
    Anon,
    /// A file, from a page-aligned offset.
    File {
        /// The file.
        file: Name,
        /// The file offset of the mapping's first byte.
        offset: u64,
    },
}

/// Where `mmap` places a mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// No address given: the kernel chooses.
    Anywhere,
    /// `hint ADDR`: the address as a hint, no flag.
    Hint(AddrExpr),
    /// `fixed ADDR`: MAP_FIXED.
    Fixed(AddrExpr),
    /// `noreplace ADDR`: MAP_FIXED_NOREPLACE.
    FixedNoreplace(AddrExpr),
}

impl Placement {
    /// The address given, if any.
    pub fn addr(&self) -> Option<&AddrExpr> {
        match self {
            Placement::Anywhere => None,
            Placement::Hint(a) | Placement::Fixed(a) | Placement::FixedNoreplace(a) => Some(a),
        }
    }
}

keyword_enum! {
    /// A protection (`PROT_*` combination).
    pub enum Prot {
        /// PROT_NONE.
        None = "none",
        /// PROT_READ.
        R = "r",
        /// PROT_READ | PROT_WRITE.
        Rw = "rw",
        /// PROT_READ | PROT_EXEC.
        Rx = "rx",
        /// PROT_READ | PROT_WRITE | PROT_EXEC.
        Rwx = "rwx",
    }
}

impl Prot {
    /// The keyword of `PROT_*` bits (READ 1, WRITE 2, EXEC 4; other bits left out, as
    /// `usermm::Prot::from_bits` decodes them): the language names only readable
    /// combinations, so write or exec without read is written with read, as x86 and arm64
    /// page tables map them (a writable or executable user page is readable). What a
    /// recorded `mmap`/`mprotect` becomes in `usermm trace export`.
    pub fn from_bits(bits: u32) -> Prot {
        let p = usermm::Prot::from_bits(bits);
        match (p.read, p.write, p.exec) {
            (_, true, true) => Prot::Rwx,
            (_, true, false) => Prot::Rw,
            (_, false, true) => Prot::Rx,
            (true, false, false) => Prot::R,
            (false, false, false) => Prot::None,
        }
    }

    /// The `PROT_*` bits (READ 1, WRITE 2, EXEC 4).
    pub fn bits(self) -> u32 {
        match self {
            Prot::None => 0,
            Prot::R => 1,
            Prot::Rw => 3,
            Prot::Rx => 5,
            Prot::Rwx => 7,
        }
    }
}

keyword_enum! {
    /// Private or shared mapping.
    pub enum Sharing {
        /// MAP_PRIVATE.
        Private = "private",
        /// MAP_SHARED.
        Shared = "shared",
    }
}

/// How `brk` moves the break.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BrkDelta {
    /// `+SIZE`: grow the heap.
    Grow(u64),
    /// `-SIZE`: shrink it.
    Shrink(u64),
}

keyword_enum! {
    /// A `madvise` advice.
    pub enum Advice {
        /// MADV_NORMAL.
        Normal = "normal",
        /// MADV_RANDOM.
        Random = "random",
        /// MADV_SEQUENTIAL.
        Sequential = "sequential",
        /// MADV_WILLNEED.
        Willneed = "willneed",
        /// MADV_DONTNEED.
        Dontneed = "dontneed",
        /// MADV_FREE.
        Free = "free",
        /// MADV_REMOVE.
        Remove = "remove",
        /// MADV_DONTFORK.
        Dontfork = "dontfork",
        /// MADV_DOFORK.
        Dofork = "dofork",
        /// MADV_MERGEABLE.
        Mergeable = "mergeable",
        /// MADV_UNMERGEABLE.
        Unmergeable = "unmergeable",
        /// MADV_HUGEPAGE.
        Hugepage = "hugepage",
        /// MADV_NOHUGEPAGE.
        Nohugepage = "nohugepage",
        /// MADV_DONTDUMP.
        Dontdump = "dontdump",
        /// MADV_DODUMP.
        Dodump = "dodump",
        /// MADV_WIPEONFORK.
        Wipeonfork = "wipeonfork",
        /// MADV_KEEPONFORK.
        Keeponfork = "keeponfork",
        /// MADV_COLD.
        Cold = "cold",
        /// MADV_PAGEOUT.
        Pageout = "pageout",
        /// MADV_POPULATE_READ.
        PopulateRead = "populate_read",
        /// MADV_POPULATE_WRITE.
        PopulateWrite = "populate_write",
        /// MADV_DONTNEED_LOCKED.
        DontneedLocked = "dontneed_locked",
        /// MADV_COLLAPSE.
        Collapse = "collapse",
    }
}

impl Advice {
    /// The `MADV_*` value (the engine's table, `usermm::Advice::number`).
    pub fn number(self) -> i32 {
        usermm::Advice::from(self).number()
    }
}

impl From<Advice> for usermm::Advice {
    /// The engine's advice for a scenario keyword.
    fn from(a: Advice) -> usermm::Advice {
        match a {
            Advice::Dontneed => usermm::Advice::DontNeed,
            Advice::Hugepage => usermm::Advice::HugePage,
            Advice::Nohugepage => usermm::Advice::NoHugePage,
            Advice::Dontfork => usermm::Advice::DontFork,
            Advice::Dofork => usermm::Advice::DoFork,
            Advice::Wipeonfork => usermm::Advice::WipeOnFork,
            Advice::Keeponfork => usermm::Advice::KeepOnFork,
            Advice::Normal => usermm::Advice::Normal,
            Advice::Random => usermm::Advice::Random,
            Advice::Sequential => usermm::Advice::Sequential,
            Advice::Willneed => usermm::Advice::WillNeed,
            Advice::Dontdump => usermm::Advice::DontDump,
            Advice::Dodump => usermm::Advice::DoDump,
            Advice::Mergeable => usermm::Advice::Mergeable,
            Advice::Unmergeable => usermm::Advice::Unmergeable,
            Advice::Cold => usermm::Advice::Cold,
            Advice::Pageout => usermm::Advice::PageOut,
            Advice::Free => usermm::Advice::Free,
            Advice::Remove => usermm::Advice::Remove,
            Advice::DontneedLocked => usermm::Advice::DontNeedLocked,
            Advice::PopulateRead => usermm::Advice::PopulateRead,
            Advice::PopulateWrite => usermm::Advice::PopulateWrite,
            Advice::Collapse => usermm::Advice::Collapse,
        }
    }
}

keyword_enum! {
    /// One `mlockall` flag.
    pub enum MlockallFlag {
        /// MCL_CURRENT.
        Current = "current",
        /// MCL_FUTURE.
        Future = "future",
        /// MCL_ONFAULT.
        Onfault = "onfault",
    }
}

/// The flags of `mlockall` (printed in the order current, future, onfault).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MlockallFlags {
    /// MCL_CURRENT.
    pub current: bool,
    /// MCL_FUTURE.
    pub future: bool,
    /// MCL_ONFAULT.
    pub onfault: bool,
}

impl MlockallFlags {
    /// The `MCL_*` bits (CURRENT 1, FUTURE 2, ONFAULT 4).
    pub fn bits(self) -> u32 {
        u32::from(self.current) | u32::from(self.future) << 1 | u32::from(self.onfault) << 2
    }

    /// Whether `flag` is set.
    pub fn has(self, flag: MlockallFlag) -> bool {
        match flag {
            MlockallFlag::Current => self.current,
            MlockallFlag::Future => self.future,
            MlockallFlag::Onfault => self.onfault,
        }
    }

    /// Sets `flag`.
    pub fn set(&mut self, flag: MlockallFlag) {
        match flag {
            MlockallFlag::Current => self.current = true,
            MlockallFlag::Future => self.future = true,
            MlockallFlag::Onfault => self.onfault = true,
        }
    }
}

keyword_enum! {
    /// The kind of access of `touch`.
    pub enum Access {
        /// A read access.
        Read = "read",
        /// A write access (keeps the contents).
        Write = "write",
    }
}

mod expect;
pub use expect::{BenchMark, Errno, Expect, Outcome, Signal};
mod observe;
pub use observe::{FlagCheck, KpageFlag, PagemapState, Perms, SmapsField, StatusField};
