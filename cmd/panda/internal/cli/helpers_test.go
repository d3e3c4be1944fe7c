package cli

import "time"

func timeSeconds(n int) time.Duration { return time.Duration(n) * time.Second }
