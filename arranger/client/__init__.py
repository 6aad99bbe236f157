"""client is the Python SDK (AsyncClient, Client) and the `arranger` command line."""
