"""Progress of the long commands (`verify --wait`, `rebuild-balances`) on stderr.

Shown on a terminal by default and never in a pipe or a log (stdout stays the command's answer, stderr stays
free of redraws), unless --progress / --no-progress says otherwise. rich (already the CLI's table and bar
library) draws it; a bar clears itself when its step ends.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterable, Iterator, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

T = TypeVar("T")


def wanted(flag: bool | None) -> bool:
    """--progress/--no-progress when given, else whether stderr is a terminal."""
    return sys.stderr.isatty() if flag is None else flag


class Steps:
    """One bar per step of a command: `counting` for records read, `set` for a measured quantity."""

    def __init__(self, progress: Progress):
        self._progress = progress
        self._tasks: dict[str, int] = {}

    def _task(self, name: str, total: float | None) -> int:
        if name not in self._tasks:
            self._tasks[name] = self._progress.add_task(name, total=total)
        return self._tasks[name]

    def counting(self, name: str, items: Iterable[T]) -> Iterator[T]:
        """items, counted on the step's bar as they pass (a count without a total)."""
        task = self._task(name, None)
        n = 0
        for item in items:
            n += 1
            if n % 1000 == 0:
                self._progress.update(task, completed=n)
            yield item
        self._progress.update(task, completed=n, total=n)

    def set(self, name: str, completed: float, total: float | None) -> None:
        self._progress.update(self._task(name, total), completed=completed, total=total)


@contextmanager
def steps(enabled: bool) -> Iterator[Steps]:
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    # Forced to draw: --progress in a pipe (a CI log, a test) asked for it.
    console = Console(stderr=True, force_terminal=enabled)
    with Progress(*columns, console=console, transient=True, disable=not enabled) as progress:
        yield Steps(progress)
