package defaults

import (
	"testing"
	"time"
)

func TestPositive(t *testing.T) {
	tests := []struct {
		name string
		v, d time.Duration
		want time.Duration
	}{
		{"zero takes the default", 0, time.Second, time.Second},
		{"negative takes the default", -time.Minute, time.Second, time.Second},
		{"positive is kept", time.Minute, time.Second, time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := tt.v
			Positive(&v, tt.d)
			if v != tt.want {
				t.Errorf("Positive(%v, %v) = %v, want %v", tt.v, tt.d, v, tt.want)
			}
		})
	}
}
