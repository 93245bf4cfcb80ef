"""One model call: call strategies with the timeouts a socket cannot give, failover, the call-level hooks."""
