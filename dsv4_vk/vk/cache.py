"""The device's cache of compiled programs, bounded by its byte budget.

Entries are anything with `nbytes` and `release()` (the executor's compiled graphs), cached by a key
such as (op, shapes, flags). A caller checks an entry out with `acquire` (None: build one) and gives it back with
`put`: while checked out no other caller gets it (a concurrent caller with the same key gets
another one, compiled for it), so per-call buffers are never shared between concurrent calls.
Idle entries and the pool's free buffers together stay within `Device.cache_bytes`
(DSV4_VK_CACHE_BYTES): free buffers are destroyed first, then the least recently used entries.
"""
import collections
import threading


class ProgramCache:
    def __init__(self, device):
        self.device = device
        self._lock = threading.Lock()
        self._idle = collections.OrderedDict()    # key -> [entry], least recently used key first
        self.nbytes = 0                           # bytes of idle entries
        self.count = 0
        self._dropped = collections.deque()       # owners gone (from finalizers: no lock taken there)

    def acquire(self, key):
        """An idle entry of `key`, checked out; None when there is none (the caller builds one,
        which counts once it is put back)."""
        if self._dropped:
            while self._dropped:
                self.drop(self._dropped.popleft())
        with self._lock:
            entries = self._idle.get(key)
            if not entries:
                self.device.check_open()
                return None
            entry = entries.pop()        # an emptied list stays (a tuple key is hashed at every lookup)
            self.nbytes -= entry.nbytes
            self.count -= 1
            return entry

    def put(self, key, entry):
        """Give a checked-out entry back (most recently used), then hold the budget."""
        dev, idle = self.device, self._idle         # (the per-call path: attributes read once)
        with self._lock:
            if dev._closed:
                return
            entries = idle.get(key)
            if entries is None:
                idle[key] = [entry]
            else:
                entries.append(entry)
                idle.move_to_end(key)
            self.nbytes += entry.nbytes
            self.count += 1
        # the pool took back what was queued at this call's allocation (BufferPool.take): over the
        # budget only if this sum says so
        if self.nbytes + dev.pool.free_bytes > dev.cache_bytes:
            self.enforce_budget()

    def _evict(self, keep_bytes, owner=None):
        """Remove idle entries, least recently used first, until ≤ keep_bytes remain (or all of
        `owner`'s: keys whose first element is `owner`). Returns them, to release outside the lock."""
        out = []
        with self._lock:
            for key in list(self._idle):
                if owner is None and self.nbytes <= keep_bytes:
                    break
                if owner is not None and not (isinstance(key, tuple) and key and key[0] == owner):
                    continue
                entries = self._idle[key]
                while entries and (owner is not None or self.nbytes > keep_bytes):
                    e = entries.pop(0)
                    self.nbytes -= e.nbytes
                    self.count -= 1
                    out.append(e)
                if not entries:
                    del self._idle[key]
        return out

    def enforce_budget(self):
        """Free pooled buffers, then evict programs, until both fit in the device's budget."""
        dev = self.device
        budget = dev.cache_bytes
        dev.pool.drain()            # tensors collected since the last pool call count too
        if self.nbytes + dev.pool.free_bytes <= budget:
            return
        dev.pool.shrink(max(0, budget - self.nbytes))
        if self.nbytes + dev.pool.free_bytes > budget:
            for e in self._evict(budget):
                e.release()          # its buffers return to the pool ...
            dev.pool.shrink(max(0, budget - self.nbytes))   # ... and are freed past the budget

    def drop_later(self, owner):
        """drop(owner) at the next acquire: safe from a finalizer, which may run inside any lock."""
        self._dropped.append(owner)

    def drop(self, owner):
        """Release the idle entries whose key starts with `owner` (an object that is going away)."""
        for e in self._evict(0, owner):
            e.release()

    def trim(self):
        for e in self._evict(0):
            e.release()

    def clear(self):
        """Forget every entry (the device is closing: their resources go with it)."""
        with self._lock:
            self._idle.clear()
            self.nbytes = self.count = 0
