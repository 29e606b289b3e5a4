"""The Ray Serve application: the three roles as Serve deployments built from the same in-process
classes, routed to the replica holding a session's KV (docs/ray.md). Its Serve config and image live
in deploy/ray.

Builds the roles through specpipe.app; imported by nothing but `specpipe serve-ray` and Ray itself."""
