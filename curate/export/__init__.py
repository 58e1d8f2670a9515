"""Dataset exports in layouts other tools read: webdataset shards (:mod:`curate.export.webdataset`).
The released CounterAnimal folder layout is :mod:`curate.split.export`."""
