"""The watch fold: a fleet's KV-cache events turned into what its views show.

``WatchFold.apply`` takes ``watch_blocks`` rows as the recorder writes them and
keeps, in memory, each source's cache (``SourceCache``: its shelves per medium
and group, and the removals it remembers), the fleet's bounded memory of
removals (``RemovalMemory``) and one prefix tree per engine kind
(``PrefixTree``: who stored and who holds each block, the fleet's
duplication). ``WatchFold.changes`` hands what changed to db/ as rows
(``db.watch_aggregates.AggregateRows``); ``refold`` folds a run again from the
raw rows its file holds.

The rules, written once here (docs/watch.md explains them for users):

- A hash stored again while its source holds it there is re-announced. It is a
  second physical copy only in the batch that stored it (two requests computed
  one block in one step); otherwise a hit re-announced (vLLM's report mode full
  re-announces every hit block of a request, and removes each physical block once).
- New on a source that had removed it: recomputation after eviction (more KV
  memory would have saved it). New on one source while another source of the same
  engine kind holds it: a routing miss (a KV-aware router would have hit it).
- A clear or reset empties the source; what it held is not remembered as evicted.
"""

from kvscope.profiler.watch.fold.fold import WatchFold
from kvscope.profiler.watch.fold.refold import fold_run, refold_stale

__all__ = ["WatchFold", "fold_run", "refold_stale"]
