"""Where the job's actors run (issue 40, docs/cluster.md): Ray started or joined
(:mod:`.placement`, a local head for ``make run`` in :mod:`.head`), the data an actor reads
shipped to its node (:mod:`.node_data`), where each actor landed and which nodes went
(:mod:`.placement_record`), bounded waits on Ray (:mod:`.waits`) and the elastic fleet of
rollout workers (:mod:`.fleet`). Above the benchmarks and below the actors in the layers
(docs/architecture.md "Layers").
"""
