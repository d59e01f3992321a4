package experts

import (
	"errors"
	"os"
	"runtime"
	"sync"
)

var (
	errPopulateUnsupported = errors.New("populating pages is not supported")
	errOutOfMemory         = errors.New("out of memory")
)

// prefaultPiece is the span one worker pre-faults at a time.
const prefaultPiece = 64 << 20

// prefault backs every page of b (fresh memory from allocBuf) before it is
// used, so that later reads into b copy into present pages instead of taking
// a page fault and a zero-fill per page. populate is the system call that does
// it in bulk (populateWrite); where it is unsupported, the pages are written
// one byte per page instead, which keeps b's contents (zeros) unchanged. The
// work is split over up to workers goroutines. An out-of-memory answer is an
// error; with the fallback, the system may instead kill the process.
func prefault(b []byte, workers int, populate func([]byte) error) error {
	if len(b) == 0 {
		return nil
	}
	page := os.Getpagesize()
	n := (len(b) + prefaultPiece - 1) / prefaultPiece
	workers = max(1, min(workers, n))
	var (
		mu    sync.Mutex
		first error
		next  int
		wg    sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				stop := first != nil
				mu.Unlock()
				if i >= n || stop {
					return
				}
				p := b[i*prefaultPiece : min(len(b), (i+1)*prefaultPiece)]
				err := populate(p)
				if errors.Is(err, errPopulateUnsupported) {
					for j := 0; j < len(p); j += page {
						p[j] = 0
					}
					err = nil
				}
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return first
}

// prefaultWorkers is how many goroutines pre-fault a store's slot memory.
func prefaultWorkers() int { return runtime.GOMAXPROCS(0) }
