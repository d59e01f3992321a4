package cuda

// deviceMS records a timing event on s, runs f (which enqueues work on s),
// records a second event, waits for it and returns the device milliseconds
// between the two. Must run on the device thread (inside Do).
func deviceMS(c *Ctx, s Stream, f func() error) (float64, error) {
	e0, err := c.NewEvent(true)
	if err != nil {
		return 0, err
	}
	defer c.DestroyEvent(e0)
	e1, err := c.NewEvent(true)
	if err != nil {
		return 0, err
	}
	defer c.DestroyEvent(e1)
	if err := c.Record(e0, s); err != nil {
		return 0, err
	}
	if err := f(); err != nil {
		return 0, err
	}
	if err := c.Record(e1, s); err != nil {
		return 0, err
	}
	if err := c.WaitEvent(e1); err != nil {
		return 0, err
	}
	return c.Elapsed(e0, e1)
}

// repeat returns a function that calls f n times, stopping at the first
// error.
func repeat(n int, f func() error) func() error {
	return func() error {
		for range n {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	}
}
