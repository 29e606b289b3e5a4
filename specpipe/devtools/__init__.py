"""Development and test launchers of the backing services a deployment brings its own of: a private
redis-server (local_redis: `specpipe up --cache redis`, the tests' Redis) and a local Redis Cluster
(local_cluster: the cluster tests and benches). No role uses them; production runs its own Redis
(deploy/k8s).

A layer beside the roles (docs/design.md, "Layers"; .importlinter): it imports specpipe.core only and
is imported from above (specpipe.app, the CLI, the bench) and by tests and scripts, never by a role."""
