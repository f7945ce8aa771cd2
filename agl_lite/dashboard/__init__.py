"""The dashboard's library: its sessions, the pages' data read from the store, and their templates and static
files. The `dashboard` addon (`agl_lite.addons.dashboard`) serves it; docs/dashboard.md says what each page shows.
"""
