"""Workers: the processes that drive queued runs under leases, fire cron schedules and run
triggers, and expire the interrupts nobody answered in time."""
