"""Tools around sweeps: a local cluster of ``cluster.yaml``'s node types (``local_cluster``),
a Ray cluster across network namespaces (``cluster_hosts``), and a team's record on
PostgreSQL (``team_store``)."""
