"""What the outside world touches, one subpackage per job.

``spark``: the committed log as a Spark DataFrame (reader, consumer checkpoints, export);
``cli``: the ``rayledger`` command line, the demo and the Ray job entry point;
``bench``: one benchmark module per layer behind one entry point.
``connect`` is the one place a driver attaches to a running Ray cluster.
"""
