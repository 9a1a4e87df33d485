"""The side-by-side benchmark suite: upr and the change feeds users would pick instead.

Theory of operation: every system (ours and each peer) is a :class:`bench.suite.adapter.System`
that can start itself on 127.0.0.1 in a temp dir, hand out a :class:`Writer` (runs in this
process, returns when the system acknowledges with its stated durability) and name a stream
factory that a *separate* consumer process (:mod:`bench.suite.child`) imports to read the feed.
The workloads (:mod:`bench.suite.workloads`) only speak to that interface, so each figure is
measured the same way for every system, in the same run, and reported as a ratio to ours.
"""
