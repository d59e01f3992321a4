package cuda

import "unsafe"

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

// spinKernel returns linear.cu's spin kernel (timed's lead-in).
func spinKernel(c *Ctx) (*Kernel, error) {
	m, err := c.linearModule()
	if err != nil {
		return nil, err
	}
	return m.Kernel("spin")
}

// timed runs reps repetitions of: spin (so the host can queue ahead), event,
// n launches, event; it returns the per-launch device times (µs).
func timed(c *Ctx, spin *Kernel, n, reps int, launch func(i int) error) ([]float64, error) {
	s := c.Stream()
	out := make([]float64, 0, reps)
	spinNS := int64(500_000 + n*15_000)
	for range reps {
		if err := c.Launch(spin, Dim3{X: 1}, Dim3{X: 1}, 0, s, unsafe.Pointer(&spinNS)); err != nil {
			return nil, err
		}
		ms, err := deviceMS(c, s, func() error {
			for i := range n {
				if err := launch(i); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		out = append(out, ms*1000/float64(n))
	}
	return out, nil
}
