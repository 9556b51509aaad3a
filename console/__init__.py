"""Organizations, members, API keys, organization settings, the audit log and the console."""
