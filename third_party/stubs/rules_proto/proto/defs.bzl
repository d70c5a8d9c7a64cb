"""Offline stand-in for rules_proto (Ferry generates protos with the system protoc)."""

def proto_library(**kwargs):
    native.proto_library(**kwargs)
