"""Windows over keyed streams: the window operator, assigners, triggers, timers, watermarks and timestamps."""
