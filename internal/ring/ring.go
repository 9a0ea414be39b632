// Package ring keeps the last N items of a stream in memory and publishes
// new ones to subscribers: the per-sandbox connection and request records
// the API lists and streams.
package ring

import "sync"

// Ring is a bounded buffer of the latest items with subscribers. It is safe
// for concurrent use; Add never blocks: a subscriber that falls behind by
// more than its buffer loses items and learns how many.
type Ring[T any] struct {
	// mu guards the following fields.
	mu    sync.Mutex
	buf   []T
	next  int // index of the next write
	full  bool
	total uint64
	subs  map[*Sub[T]]struct{}
}

// New returns a ring holding the last size items (size ≥ 1).
func New[T any](size int) *Ring[T] {
	if size < 1 {
		size = 1
	}
	return &Ring[T]{buf: make([]T, size), subs: make(map[*Sub[T]]struct{})}
}

// Add appends an item and hands it to every subscriber.
func (r *Ring[T]) Add(v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf[r.next] = v
	r.next = (r.next + 1) % len(r.buf)
	if r.next == 0 {
		r.full = true
	}
	r.total++
	for s := range r.subs {
		select {
		case s.c <- v:
		default:
			s.mu.Lock()
			s.dropped++
			s.mu.Unlock()
		}
	}
}

// List returns the items held, oldest first.
func (r *Ring[T]) List() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.full {
		return append([]T(nil), r.buf[:r.next]...)
	}
	return append(append([]T(nil), r.buf[r.next:]...), r.buf[:r.next]...)
}

// Total returns how many items were ever added.
func (r *Ring[T]) Total() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total
}

// Sub is a subscription.
type Sub[T any] struct {
	c       chan T
	r       *Ring[T]
	mu      sync.Mutex // guards dropped
	dropped uint64
	once    sync.Once
}

// Subscribe returns a subscription that receives items added from now on,
// buffering up to buf of them.
func (r *Ring[T]) Subscribe(buf int) *Sub[T] {
	s := &Sub[T]{c: make(chan T, buf), r: r}
	r.mu.Lock()
	r.subs[s] = struct{}{}
	r.mu.Unlock()
	return s
}

// C delivers the items; it is closed by Close.
func (s *Sub[T]) C() <-chan T { return s.c }

// Dropped returns how many items this subscriber missed for being slow.
func (s *Sub[T]) Dropped() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

// Close ends the subscription. It is idempotent.
func (s *Sub[T]) Close() {
	s.once.Do(func() {
		s.r.mu.Lock()
		delete(s.r.subs, s)
		s.r.mu.Unlock()
		close(s.c)
	})
}
