"""The parts ``TopicProcessor`` composes, each chosen once at start (modes are objects,
not flags):

- ``committer``: how a turn's input offsets are committed, and nothing more (through
  the consumer, or exactly-once in the turn's transaction), the commit notes that say
  a loop is running (announce, heartbeat, stopped note), fencing, and the one-runner
  check;
- ``turns``: how a turn of the engine is run (once, or under exactly-once again after
  a transient abort, on rebuilt processors);
- ``assignment``: static partition sets or group membership; opens and closes
  partitions (through ``partitions``), and says when the loop is caught up;
- ``partitions``: a partition opened on the turn engine (stores restored, processor
  built) or closed;
- ``peers``: group mode's co-partitioning: partitions waiting, paused, for their peers
  of the other input topics, within a bound;
- ``prefetch``: gathers and sizes each batch, and reads the next one while a turn's
  acks are outstanding;
- ``progress``: committed offsets, high watermarks and what is left to consume;
- ``leader``: which of an app's processes runs its leader-only tasks (an election
  through a consumer group of its own), or no election at all;
- ``servers``: the HTTP servers the loop owns, the metrics and query apps mounted on them;
- ``signals``: SIGTERM and SIGINT closing a running loop.

Nothing here imports ``kasper_py.topic_processor``; the loop imports these.
"""
