"""Names reserved for the keywords of Program.run() and launch(), now or planned."""

__all__ = ["RESERVED_NAMES"]

# run(**inputs) takes inputs as keywords, so an input named like one of these is unreachable
RESERVED_NAMES = frozenset({"out", "trace", "stream", "self"})
