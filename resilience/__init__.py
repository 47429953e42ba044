"""What a run does when a rank fails, hangs or lags, and the faults injected to test it (docs/resiliency.md, fault by
fault). Two floors: the modules here need only base/ and the launch's rendezvous store (heartbeats, the flight
recorder and its collective log, failure agreement, the restart and attempt stores, the connection abort, hot
spares, the fault injector's plan), so parallel/ may use them; resilience/run/ works on a training run."""
