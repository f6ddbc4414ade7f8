"""Support code the tests share: event types and drain, worker processes, a throwaway PostgreSQL."""
