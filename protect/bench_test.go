package protect

import (
	"testing"
	"time"
)

// BenchmarkAcquireDone: the cost protect adds to one request, serial and
// from every core at once (one mutex per rule).
func BenchmarkAcquireDone(b *testing.B) {
	for _, bc := range []struct {
		name string
		cfg  Config
	}{
		{"fixed", Config{Name: "api", Concurrency: 1 << 20}},
		{"adaptive", Config{Name: "api", Adaptive: true, MaxConcurrency: 1 << 20}},
		{"breaker", Config{Name: "api", Breaker: &BreakerConfig{ErrorRatio: 0.5, Window: 10 * time.Second}}},
		{"adaptive+breaker+reserve", Config{Name: "api", Adaptive: true, MaxConcurrency: 1 << 20, Reserve: 0.2,
			Breaker: &BreakerConfig{SlowCall: time.Second, SlowRatio: 0.5, ErrorRatio: 0.5}}},
	} {
		r, err := New(bc.cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				t, err := r.Acquire(Normal)
				if err != nil {
					b.Fatal(err)
				}
				t.Done(false)
			}
		})
		b.Run(bc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					t, err := r.Acquire(Critical)
					if err != nil {
						b.Error(err)
						return
					}
					t.Done(false)
				}
			})
		})
	}
}
