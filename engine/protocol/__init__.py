"""The stream protocol, sans-I/O: message types, frame codecs, barrier and flow-control bookkeeping. Standard library only."""
