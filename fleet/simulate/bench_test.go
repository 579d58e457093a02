package simulate

import (
	"context"
	"testing"
)

func benchWindows(b *testing.B, zones []string, deadlineH int) {
	s := v100Setup(b, zones, deadlineH)
	s.Windows = 20
	s.Parallel = 1
	for b.Loop() {
		if _, err := s.Run(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkWindows9z60h(b *testing.B) { benchWindows(b, nil, 60) }

func BenchmarkWindows3z52h(b *testing.B) {
	benchWindows(b, []string{"us-east-1c", "us-east-2b", "us-west-2a"}, 52)
}

func BenchmarkOptimum(b *testing.B) {
	s := v100Setup(b, nil, 60)
	s.Windows = 50
	starts, _, err := s.windows()
	if err != nil {
		b.Fatal(err)
	}
	var op optimizer
	i := 0
	for b.Loop() {
		if _, err := op.solve(s.market.Offers, starts[i%len(starts)], s.Job, 1, 3.06); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
