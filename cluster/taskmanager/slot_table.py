"""A TaskManager's own slot table: which job holds each of its slots (pure bookkeeping)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class SlotOwner:
    job_id: str
    allocation_id: str


class SlotTable:
    def __init__(self, number_of_slots: int):
        self._slots: list[Optional[SlotOwner]] = [None] * number_of_slots

    def __len__(self) -> int:
        return len(self._slots)

    def allocate(self, index: int, job_id: str, allocation_id: str) -> bool:
        """Give slot ``index`` to a job; idempotent for the same allocation, False if held by another."""
        if not 0 <= index < len(self._slots):
            return False
        owner = self._slots[index]
        if owner is not None and owner.allocation_id != allocation_id:
            return False
        self._slots[index] = SlotOwner(job_id, allocation_id)
        return True

    def free(self, allocation_id: str) -> Optional[str]:
        """Free the slot of an allocation; returns its job id, or None if no slot had it."""
        for i, owner in enumerate(self._slots):
            if owner is not None and owner.allocation_id == allocation_id:
                self._slots[i] = None
                return owner.job_id
        return None

    def holds(self, allocation_id: str, job_id: str) -> bool:
        return SlotOwner(job_id, allocation_id) in self._slots

    def jobs(self) -> set[str]:
        return {o.job_id for o in self._slots if o is not None}

    def free_count(self) -> int:
        return sum(1 for o in self._slots if o is None)
