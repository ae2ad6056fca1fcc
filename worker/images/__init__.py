"""Pack images: identity, build or reuse by content digest, the sandbox base image, the engine."""
