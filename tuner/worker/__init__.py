"""Workers: long-lived processes that run trials, each trial's build+check+time in a fresh child."""
