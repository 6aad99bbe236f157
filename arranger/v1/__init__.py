"""arranger.v1 is the generated wire contract; regenerate with scripts/gen_protos.py, never edit.

Modules: job_pb2 (TYJob spec and status), node_pb2 (nodes), arranger_pb2/_grpc (the client API),
agent_pb2/_grpc (the agent stream).
"""
