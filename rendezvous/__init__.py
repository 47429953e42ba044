"""A rank's life through the launch's rendezvous store, a floor above base/ and below parallel/ (which uses it): the
heartbeats, the flight recorder and its collective log, failure agreement, the restart and attempt stores, the
connection abort, hot spares, the fault injector's plan. What a run does with them when a rank fails, hangs or lags
is resilience/'s, a floor below training/ (docs/resiliency.md, fault by fault)."""
