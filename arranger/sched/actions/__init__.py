"""actions are the steps of a cycle, in order: allocate (gang minimums), backfill (the rest)."""
