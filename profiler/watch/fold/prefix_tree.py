"""The prefix tree of one engine kind: every block ever stored, by its parent, and
which sources hold each block now (the fleet's duplication).

A block's node is made only when something needs it. The blocks one event
stored as a run of new blocks stay one ``Chain`` record until one of them is
touched (another source stores it, a child hangs off its middle, a walk up goes
through it): most of a fleet's blocks are parts of chains nothing else ever
touches, so most stores make no node at all.
"""

from __future__ import annotations

import heapq
from collections import deque
from itertools import repeat
from typing import TYPE_CHECKING

from kvscope.db.watch_aggregates import TOP_PREFIXES

if TYPE_CHECKING:
    from kvscope.profiler.watch.fold.source_cache import SourceCache


class Node:
    """One block of the tree. ``above`` is the parent's node where it was made with
    it, sparing the walk up a dict lookup a step (a multi-turn session's chain is
    hundreds of blocks deep); None for a chain's first block or a root."""

    __slots__ = ("parent", "depth", "children", "subtree", "bits", "above")

    def __init__(self, parent: int | None, depth: int, children: int, subtree: int, bits: int,
                 above: Node | None) -> None:  # fmt: skip
        self.parent = parent  # the parent block's hash (None: a root of the stream)
        self.depth = depth  # blocks from the root, this one included
        self.children = children  # children ever hung under it
        self.subtree = subtree  # blocks ever stored under it, itself included
        self.bits = bits  # the sources that stored it
        self.above = above


class Chain:
    """The blocks one event stored as a chain of new nodes, while nothing has touched
    any of them: one record for them all, made into nodes (``PrefixTree.unchain``) the
    first time one is needed. New blocks its source stores under its last block
    extend it (a session's next turn, a request's decode steps)."""

    __slots__ = ("parent", "depth", "hashes", "bits", "owned")

    def __init__(self, parent: int | None, depth: int, hashes: list[int], bits: int) -> None:
        self.parent = parent  # of the first block
        self.depth = depth  # of the first block's parent (0: a root)
        self.hashes = hashes  # the event's list, until extended (then its own: owned)
        self.bits = bits
        self.owned = False


class PrefixTree:
    """Every block an engine kind's sources stored, and who holds each now.

    Who holds a block is kept in ``held`` only for blocks two or more sources have
    stored: a block one source alone ever stored is held by that source exactly
    while one of its shelves holds it (``holders``). Most blocks are one source's,
    so most stores and removals touch no fleet-wide dict."""

    __slots__ = ("nodes", "held", "by_bit", "branch_points", "roots", "max_depth", "duplicated",
                 "extra", "peak", "dirty")  # fmt: skip

    def __init__(self) -> None:
        self.nodes: dict[int, Node | Chain] = {}  # hash -> its node, or the chain it is in
        # hash -> sources holding it now (bits), never 0: of hashes >= 2 sources stored
        self.held: dict[int, int] = {}
        self.by_bit: dict[int, SourceCache] = {}  # the tree's sources, by their bit
        self.branch_points: set[int] = set()
        self.roots = 0
        self.max_depth = 0
        self.duplicated = 0  # hashes held by >= 2 sources now
        self.extra = 0  # copies beyond the first, across sources
        self.peak = 0
        self.dirty = False  # the shared prefixes may have changed since the last ranking

    # --- holders ------------------------------------------------------------------------

    def holders(self, block: int, stored_by: int) -> int:
        """The sources holding ``block`` now (bits), given those that stored it."""
        if stored_by & (stored_by - 1):
            return self.held.get(block, 0)
        src = self.by_bit.get(stored_by)
        return stored_by if src is not None and block in src.all_held() else 0

    def add_holder(self, block: int, stored_by: int, bit: int) -> bool:
        """Source ``bit`` holds ``block`` now, new on it, which others stored too
        (``stored_by``: its node's bits before this store); returns whether another
        source holds it (a routing miss)."""
        mask = self.holders(block, stored_by) & ~bit
        self.held[block] = mask | bit
        if not mask:
            return False
        self.extra += 1
        if mask & (mask - 1) == 0:
            self.duplicated += 1
        return True

    def release(self, block: int, bit: int) -> None:
        """Source ``bit`` no longer holds ``block``."""
        held = self.held
        mask = held.get(block, 0)
        if not mask & bit:
            return
        mask &= ~bit
        if not mask:
            del held[block]
            return
        held[block] = mask
        self.extra -= 1
        if mask & (mask - 1) == 0:
            self.duplicated -= 1

    def stored_by(self, block: int) -> int:
        """The sources that stored ``block`` (bits; 0: none, or the tree forgot it)."""
        node = self.nodes.get(block)
        return 0 if node is None else node.bits

    # --- nodes --------------------------------------------------------------------------

    def unchain(self, chain: Chain, block: int) -> Node:
        """Make ``chain``'s nodes, as they would have been made at once; returns
        ``block``'s."""
        nodes = self.nodes
        hashes = chain.hashes
        n = len(hashes)
        depth, bits = chain.depth, chain.bits
        up = chain.parent
        above = None  # the first block's parent node: looked up when walked to
        for i, h in enumerate(hashes):
            if nodes.get(h) is chain:
                above = nodes[h] = Node(up, depth + i + 1, 1 if i < n - 1 else 0, n - i, bits,
                                        above)  # fmt: skip
            else:
                above = None
            up = h
        return nodes[block]

    def node(self, block: int) -> Node | None:
        """``block``'s node, made from its chain if need be; None if not in the tree."""
        node = self.nodes.get(block)
        if node.__class__ is Chain:
            node = self.unchain(node, block)
        return node

    def hang(self, parent: int | None) -> Node | None:
        """One more child under ``parent``: the parent's node, or None when it is not
        in the tree and the child is a new root."""
        above = None if parent is None else self.node(parent)
        if above is None:
            self.roots += 1
            return None
        above.children += 1
        if above.children == 2:
            self.branch_points.add(parent)
        return above

    def add_leaf(self, block: int, parent: int | None, bit: int) -> None:
        """One new block under ``parent`` (not in the tree, ``block != parent``)."""
        if parent is not None and self.extend(parent, [block], bit):
            return
        above = self.hang(parent)
        depth = 1 if above is None else above.depth + 1
        if depth > self.max_depth:
            self.max_depth = depth
        self.nodes[block] = Node(parent, depth, 0, 1, bit, above)
        self.dirty = True
        if above is not None:
            self.add_above(parent, 1, above)

    def new_chain(self, hashes: list[int], parent: int | None, bit: int) -> None:
        """``hashes``, none in the tree and none twice, as a chain of new blocks under
        ``parent``: block i's parent is block i-1."""
        if parent is not None and self.extend(parent, hashes, bit):
            return
        n = len(hashes)
        above = self.hang(parent)
        depth = 0 if above is None else above.depth
        if depth + n > self.max_depth:
            self.max_depth = depth + n
        self.nodes.update(zip(hashes, repeat(Chain(parent, depth, hashes, bit))))
        self.dirty = True
        if above is not None:
            self.add_above(parent, n, above)

    def extend(self, parent: int, hashes: list[int], bit: int) -> bool:
        """``hashes`` (none in the tree, none twice) added to the chain whose last block
        is ``parent``, if the same source stored it; returns whether they were."""
        nodes = self.nodes
        chain = nodes.get(parent)
        if chain.__class__ is not Chain or chain.bits != bit or chain.hashes[-1] != parent:
            return False
        if not chain.owned:
            chain.hashes, chain.owned = list(chain.hashes), True
        chain.hashes += hashes
        depth = chain.depth + len(chain.hashes)
        if depth > self.max_depth:
            self.max_depth = depth
        nodes.update(zip(hashes, repeat(chain)))
        self.add_above(chain.parent, len(hashes))
        return True

    def add_above(self, up: int | None, added: int, node: Node | None = None) -> None:
        """``added`` blocks more under ``up`` (``node``: its node, where the caller has
        it) and each of its ancestors."""
        self.dirty = True
        if node is None:
            node = None if up is None else self.node(up)
            if node is None:
                return
        steps, limit = 0, len(self.nodes)
        while steps <= limit:  # the limit: a cycle of hashes stops
            node.subtree += added
            steps += 1
            above = node.above
            if above is None:
                if node.parent is None:
                    return
                above = self.node(node.parent)
                if above is None:
                    return
            node = above

    def grow(self, hashes: list[int], parent: int | None, bit: int, *, distinct: bool = False,
             back: set[int] | None = None) -> tuple[int, int]:  # fmt: skip
        """Every block of an event chained to its parent (``distinct``: no hash twice).
        With ``back`` not None (those of them the source had removed), every block is
        new on the source, and the fleet's holders of those other sources stored are
        kept on the way: returns (routing misses, of them in ``back``)."""
        nodes = self.nodes
        n = len(hashes)
        if nodes.keys().isdisjoint(hashes) and (distinct or len(set(hashes)) == n):
            self.new_chain(hashes, parent, bit)
            return 0, 0
        chain = []
        created = routing = both = 0
        par = parent
        for block in hashes:
            node = nodes.get(block)
            if node.__class__ is Chain:
                node = self.unchain(node, block)
            if node is None:
                above = self.hang(par if par != block else None)
                depth = 1 if above is None else above.depth + 1
                if depth > self.max_depth:
                    self.max_depth = depth
                node = nodes[block] = Node(par, depth, 0, 0, bit, above)  # subtree 0: new
                created += 1
            else:
                stored_by = node.bits
                if stored_by != bit:
                    if back is not None and self.add_holder(block, stored_by, bit):
                        routing += 1  # another source of this engine kind holds it
                        both += block in back
                    node.bits = stored_by | bit
            chain.append(node)
            par = block
        if not created:
            return routing, both
        added = 0
        for node in reversed(chain):  # only nodes made by this call have a subtree of 0
            fresh = node.subtree == 0
            node.subtree += added + fresh
            added += fresh
        self.add_above(chain[0].parent, added, chain[0].above)
        return routing, both

    # --- bounds and readings --------------------------------------------------------------

    def prune(self, count: int) -> None:
        """Forget up to ``count`` of the oldest leaves that no source holds, so a
        week-long watch's tree stays bounded; the figures above them (children seen,
        blocks stored under) keep what they counted. A chain none of whose blocks is
        held is a path of leaves and goes whole, unmade."""
        nodes, by_bit = self.nodes, self.by_bit
        gone: list[int] = []
        chains: list[Chain] = []
        taken = 0
        for block, node in nodes.items():
            if node.__class__ is Chain:
                hashes = node.hashes
                if block != hashes[0]:
                    continue  # a chain is taken at its first block, whole
                # one source stored it (another's store of a block would have made its nodes)
                src = by_bit.get(node.bits)
                if src is not None and not src.all_held().keys().isdisjoint(hashes):
                    continue
                chains.append(node)
                taken += len(hashes)
            elif not node.children and not self.holders(block, node.bits):
                gone.append(block)
                taken += 1
            else:
                continue
            if taken >= count:
                break
        for block in gone:
            del nodes[block]
        for chain in chains:
            deque(map(nodes.__delitem__, chain.hashes), 0)

    def top_prefixes(self, top: int = TOP_PREFIXES) -> list[tuple[int, Node]]:
        """The largest shared prefixes: (hash, node) of the branch points whose
        depth times extra branches is largest, then by the blocks under them."""
        nodes = self.nodes
        best = heapq.nlargest(
            top,
            self.branch_points,
            key=lambda h: (nodes[h].depth * (nodes[h].children - 1), nodes[h].subtree),
        )
        return [(h, nodes[h]) for h in best]

    def check_integrity(self) -> None:
        """Raise AssertionError where the tree's bookkeeping disagrees with itself: the
        holders and duplication against the sources' shelves, the branch points
        against the children counts, chains against their members, depths against
        the parents' nodes."""
        nodes = self.nodes
        for block, node in nodes.items():
            if node.__class__ is Chain:
                assert block in node.hashes, f"{block} points at a chain without it"
                continue
            assert node.children >= 0 and node.subtree >= 1, f"{block}: counts below zero"
            assert (node.children >= 2) == (block in self.branch_points), f"{block}: branch point"
            if node.above is not None:
                assert node.depth == node.above.depth + 1, f"{block}: depth"
        for block in self.branch_points:
            assert block in nodes and nodes[block].__class__ is Node, f"branch point {block} lost"
        duplicated = extra = 0
        for block, mask in self.held.items():
            assert mask, f"{block} held by no source but listed"
            assert block in nodes, f"held block {block} is not in the tree"
            for bit, src in self.by_bit.items():
                assert bool(mask & bit) == (block in src.all_held()), f"{block}: holders of {bit}"
            copies = mask.bit_count()
            duplicated += copies >= 2
            extra += copies - 1
        # a block one source alone stored may be held there without a mask: extra is 0
        assert (duplicated, extra) == (self.duplicated, self.extra), "duplication counts"
        for src in self.by_bit.values():
            for block in src.all_held():
                assert block in nodes, f"held block {block} is not in the tree"
