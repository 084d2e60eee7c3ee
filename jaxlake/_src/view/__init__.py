"""`jaxlake view`: the memory of a run as one self-contained HTML page."""
