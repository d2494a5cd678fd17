"""The free address ranges of one memory: an address-ordered treap, and the undo of the last allocation.

:class:`FreeList` keeps free blocks in a treap (a randomised balanced binary tree) in which every node also
remembers the largest block below it. That one extra number turns first fit into a single walk from the root,
so allocate and free cost O(log n) in the number of free blocks rather than a scan of them.

**The undo.** The commonest pattern of an eager program is an output allocated, dropped, and the same size
allocated again (``y = a + b`` in a loop). Free space as a set of ranges is canonical, so freeing the block the
last first fit took, before anything else touched the list, gives back exactly the free space that first fit
saw; a first fit of the same size then takes the same address again. The list keeps such a freed block aside
(``_undone``) instead of walking the tree twice, hands it out again for a request of its size, and puts it in
the tree before anything else reads or changes the list. Every address, free byte count and block listing is
what the tree alone would give.
"""

from __future__ import annotations

import random


# --- the free list ------------------------------------------------------------------------------
class _Block:
    """A free block as a treap node; ``largest`` is the biggest block in this node's subtree."""

    __slots__ = ("largest", "left", "priority", "right", "size", "start")

    def __init__(self, start: int, size: int, priority: float) -> None:
        self.start, self.size, self.priority = start, size, priority
        self.left: _Block | None = None
        self.right: _Block | None = None
        self.largest = size


def _refresh(node: _Block) -> None:
    largest = node.size
    if node.left is not None and node.left.largest > largest:
        largest = node.left.largest
    if node.right is not None and node.right.largest > largest:
        largest = node.right.largest
    node.largest = largest


def _split(node: _Block | None, key: int) -> tuple[_Block | None, _Block | None]:
    """Blocks starting before ``key``, and the rest."""
    if node is None:
        return None, None
    if node.start < key:
        node.right, rest = _split(node.right, key)
        _refresh(node)
        return node, rest
    before, node.left = _split(node.left, key)
    _refresh(node)
    return before, node


def _merge(low: _Block | None, high: _Block | None) -> _Block | None:
    """Join two treaps where every block of ``low`` lies below every block of ``high``."""
    if low is None:
        return high
    if high is None:
        return low
    if low.priority > high.priority:
        low.right = _merge(low.right, high)
        _refresh(low)
        return low
    high.left = _merge(low, high.left)
    _refresh(high)
    return high


class FreeList:
    """The free address ranges of one memory, in address order, neighbours always coalesced."""

    def __init__(self, start: int, size: int, seed: int = 0) -> None:
        self._rng = random.Random(seed)  # treap priorities: balance without rebalancing code
        self._root: _Block | None = None
        self._num_blocks = 0
        self.free_bytes = size                 # counts the block kept aside too
        self._taken: tuple[int, int] | None = None    # (start, size) the last first fit took, nothing since
        self._undone: tuple[int, int] | None = None   # that block, freed again, not yet in the tree
        if size:
            self._insert(start, size)

    @property
    def num_blocks(self) -> int:
        self._settle()
        return self._num_blocks

    @property
    def largest_block(self) -> int:
        self._settle()
        return self._root.largest if self._root is not None else 0

    def blocks(self) -> list[tuple[int, int]]:
        """``(start, size)`` of every free block, lowest address first."""
        self._settle()
        out, stack, node = [], [], self._root
        while stack or node is not None:
            while node is not None:
                stack.append(node)
                node = node.left
            node = stack.pop()
            out.append((node.start, node.size))
            node = node.right
        return out

    def take_first_fit(self, size: int) -> int | None:
        """Carve ``size`` bytes off the front of the lowest-address block that holds them (None if none does)."""
        undone = self._undone
        if undone is not None:
            if undone[1] == size:              # the block first fit took last time: it takes it again
                self._undone, self._taken = None, undone
                self.free_bytes -= size
                return undone[0]
            self._settle()
        node = self._root
        if node is None or node.largest < size:
            return None
        path = []
        while True:  # the left subtree holds lower addresses: go there whenever it has room
            path.append(node)
            if node.left is not None and node.left.largest >= size:
                node = node.left
            elif node.size >= size:
                break
            else:
                node = node.right
        start = node.start
        if node.size == size:
            self._remove(start)
        else:  # the shrunk block keeps its place in address order
            node.start += size
            node.size -= size
            for visited in reversed(path):
                _refresh(visited)
        self.free_bytes -= size
        self._taken = (start, size)
        return start

    def give_back(self, start: int, size: int) -> None:
        """Return ``[start, start + size)`` to the free list, merging it with free neighbours."""
        if self._taken == (start, size):       # the last first fit undone: kept aside (see the module doc)
            self._taken, self._undone = None, self._taken
            self.free_bytes += size
            return
        self._settle()
        self._taken = None
        self._merge_in(start, size)
        self.free_bytes += size

    def _settle(self) -> None:
        """Put the block kept aside into the tree: the list as the tree alone would hold it."""
        undone = self._undone
        if undone is not None:
            self._undone = self._taken = None
            self._merge_in(*undone)

    def _merge_in(self, start: int, size: int) -> None:
        before = after = None
        node = self._root
        while node is not None:
            if node.start < start:
                before, node = node, node.right
            else:
                after, node = node, node.left
        if (before is not None and before.start + before.size > start) or (
                after is not None and start + size > after.start):
            raise ValueError(f"range [{start:#x}, {start + size:#x}) overlaps free space: it was not allocated")
        joins_before = before is not None and before.start + before.size == start
        joins_after = after is not None and start + size == after.start
        if joins_before and joins_after:
            self._remove(after.start)
            self._reshape(before.start, before.start, before.size + size + after.size)
        elif joins_before:
            self._reshape(before.start, before.start, before.size + size)
        elif joins_after:
            self._reshape(after.start, start, size + after.size)
        else:
            self._insert(start, size)

    def _insert(self, start: int, size: int) -> None:
        before, after = _split(self._root, start)
        self._root = _merge(_merge(before, _Block(start, size, self._rng.random())), after)
        self._num_blocks += 1

    def _remove(self, start: int) -> None:
        before, rest = _split(self._root, start)
        _, after = _split(rest, start + 1)
        self._root = _merge(before, after)
        self._num_blocks -= 1

    def _reshape(self, key: int, start: int, size: int) -> None:
        """Give the block at ``key`` new bounds that keep its place in address order."""
        path, node = [], self._root
        while node is not None and node.start != key:
            path.append(node)
            node = node.left if key < node.start else node.right
        assert node is not None, f"no free block at {key:#x}"
        node.start, node.size = start, size
        _refresh(node)
        for visited in reversed(path):
            _refresh(visited)
