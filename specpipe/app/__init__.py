"""The composition root: the one place that decides which implementation each role gets (in-process
or a gRPC client), wiring typed configs into running objects; also the local process topology of
`specpipe up`.

Above the roles, which it imports; below the CLI, the Ray application and the bench."""
