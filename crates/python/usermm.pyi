"""Type stubs of the usermm module (the Rust extension in crates/python/src/lib.rs)."""

from typing import Dict, List, Mapping, Optional, Union

Size = Union[int, str]
"""A size: bytes as an int, or a string such as "4K", "2M", "1G", "0x2000"."""

__version__: str

class Machine:
    """One simulated machine; its methods are system calls on CPU slot 0."""

    def __init__(
        self,
        memory: Size = "1G",
        cpus: int = 2,
        tunables: Optional[Mapping[str, str]] = None,
    ) -> None: ...
    def set_tunable(self, name: str, value: str) -> None: ...
    def spawn(self, privileged: bool = False) -> int: ...
    def mmap(
        self,
        pid: int,
        length: Size,
        prot: str = "rw",
        shared: bool = False,
        populate: bool = False,
    ) -> int: ...
    def munmap(self, pid: int, addr: int, length: Size) -> None: ...
    def mprotect(self, pid: int, addr: int, length: Size, prot: str) -> None: ...
    def fork(self, pid: int) -> int: ...
    def exit(self, pid: int) -> None: ...
    def touch(self, pid: int, addr: int, length: Size, write: bool = False) -> None: ...
    def counters(self) -> Dict[str, int]:
        """Every non-zero counter since the machine was made."""
        ...
    def last_counters(self) -> Dict[str, int]:
        """What the most recent call that did mm work (spawn, mmap, munmap, mprotect, fork,
        exit, touch) moved: counter name -> delta, the non-zero ones; set even when the call
        raised; views (counters, status, validate) leave it alone. Empty before the first."""
        ...
    def status(self, pid: int) -> Dict[str, int]: ...
    def validate(self) -> None: ...

class Session:
    """The scenario language (docs/scenario-language.md) run a chunk at a time on one engine."""

    def __init__(
        self,
        tunables: Optional[Mapping[str, str]] = None,
        validate: bool = True,
    ) -> None: ...
    def run(self, statements: str) -> Dict[str, Union[List[str], Dict[str, int]]]:
        """Runs statements; returns {"failures": [...], "dumps": [...], "counters": {...}}:
        failed expectations, what `dump` printed, and the chunk's non-zero counter deltas
        (the same as last_counters()).

        Raises ValueError on a parse error (nothing of the chunk runs) and RuntimeError when
        a statement fails without `expect` or cannot run (last_counters() then has what the
        statements before it moved)."""
        ...
    def last_counters(self) -> Dict[str, int]:
        """What the most recent run() moved: counter name -> delta, the non-zero ones."""
        ...
    def addr(self, name: str) -> int: ...
    def smaps(self, task: str, name: str) -> Dict[str, int]: ...
    def page(self, task: str, addr: str) -> Dict[str, Union[bool, int, None]]: ...
    def dump(self, task: str, addr: str, length: Size) -> str: ...
    def counters(self) -> Dict[str, int]: ...

def run_scenario(
    text: str,
    validate: bool = True,
    tunables: Optional[Mapping[str, str]] = None,
) -> Dict[str, object]:
    """Runs a whole scenario file's text on a fresh engine, as `usermm run` does:
    {"exit_code", "failures", "abort", "counters", "dumps"}."""
    ...
