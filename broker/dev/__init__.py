"""Development only: the embedded Kafka launcher, Maven jar resolution, test-broker selection
and the demo. Services (``broker`` outside ``cli`` and this package, and ``spark_jobs``
outside its demo/measure/quickstart) never import it; ``tests/unit/test_import_graph.py``
keeps it that way."""
