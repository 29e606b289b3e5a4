"""The command line: flags and the environment into typed configs (specpipe.config), handed to
specpipe.app, specpipe.bench or specpipe.rayserve. No logic of its own beyond parsing."""
