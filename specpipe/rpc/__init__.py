"""gRPC layer: proto <-> value conversions (convert), protocol clients (clients), and the one server
bootstrap every service uses (server). Servicers live in the service folders and only translate."""
