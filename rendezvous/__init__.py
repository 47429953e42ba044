"""A rank's life through the launch's rendezvous store: heartbeats, the flight recorder, failure agreement, restart and
attempt stores, hot spares and the fault injector's plan. What a run does with them is resilience/'s."""
