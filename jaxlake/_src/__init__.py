"""Private implementation of jaxlake; the public names live in jaxlake."""
