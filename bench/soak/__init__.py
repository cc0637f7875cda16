"""
amp's soak under injected faults: sustained load against a real C{twistd amp}
process while its endpoint misbehaves on purpose, its serving certificate is
rotated every few seconds and the Kubernetes API keeps cutting its namespace
watch and answering 410 Gone.  At the end it checks that amp answered every
review well-formed, that what amp counted matches what was injected, that
its log holds no unhandled error, that its memory stayed under its bound and
that it left no file descriptor open; a full run also checks that every
review was answered before the API server's timeout.  See the "Soak" section
of bench/README.md.

Usage::

    python -m bench.soak                # 10 minutes
    python -m bench.soak --minutes 30
    python -m bench.soak --quick        # 15 seconds at 100 reviews/s, behaviour only (what the test suite runs)

Exit status: 0 when every judged criterion passed, 1 when one failed, 2 when
the soak could not run (a process did not start).  The report is printed and
written to C{bench/results/soak-<UTC timestamp>.json}.

Modules, one concern each:

  - L{bench.soak.driver}: the processes, the run, the faults, the samples,
    with its options in L{bench.soak._args}, what it reads off amp in
    L{bench.soak._probes}, and the certificate it rotates in
    L{bench.soak._certificate};
  - L{bench.soak.load}: the load generator (treq over TLS keep-alive), and
    L{check_answer <bench.soak.load.check_answer>}, the API server's view
    of one answer;
  - L{bench.soak.fakeapi}: the fake Kubernetes API with a fault control port;
  - L{bench.soak.reconcile}: what was injected against what amp did;
  - L{bench.soak.report}: the criteria and the printed report;
  - L{bench.soak.settings}: namespaces, amp's settings, thresholds.

The endpoint is L{bench.chaos_endpoint}, on two ports = two endpoint
origins: C{steady}, whose circuit breaker never opens, and C{flaky}, whose
breaker opens after three failures in a row.
"""
