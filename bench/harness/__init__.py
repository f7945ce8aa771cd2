"""Load engines and process helpers shared by the benches and the reliability tests: the crash engine
(`crash_load`: SIGKILL under ingest, counted client-side), the fault engine (`fault_load`: upstream faults and
what every record must say after them) and gateways in their own processes (`gateway_process`).

Benches and tests alike import them as `bench.harness.*`, the repository's root on the path.
"""
