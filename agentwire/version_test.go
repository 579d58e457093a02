package agentwire

import "testing"

func TestCheckSkew(t *testing.T) {
	tests := []struct {
		daemon, agent string
		want          Skew
	}{
		{"v1.4.2", "v1.4.2", InWindow},
		{"v1.4.2", "v1.4.0", InWindow},
		{"v1.4.2", "v1.4.9", InWindow}, // a newer patch is fine
		{"v1.4.2", "v1.3.7", InWindow}, // one minor back: a rolling upgrade
		{"v1.4.2", "v1.2.9", TooOld},
		{"v1.4.2", "v0.9.0", TooOld},
		{"v1.4.2", "v1.5.0", TooNew},
		{"v1.4.2", "v2.0.0", TooNew},
		{"v1.0.0", "v0.9.0", TooOld}, // a major change resets the window
		{"v1.4.2-3-gdeadbee-dirty", "v1.4.0", InWindow},
		{"v1.4.2", "v1.3.0-rc.1", InWindow},
		{"dev", "dev", InWindow},
		{"ddb574f", "ddb574f", InWindow},
		{"ddb574f", "ddb574e", Unknown},
		{"v1.4.2", "dev", Unknown},
		{"dev", "v1.4.2", Unknown},
		{"v1.4.2", "", Unknown}, // an agent that does not say
		{"", "", Unknown},
	}
	for _, tt := range tests {
		if got := CheckSkew(tt.daemon, tt.agent); got != tt.want {
			t.Errorf("CheckSkew(%q, %q) = %s, want %s", tt.daemon, tt.agent, got, tt.want)
		}
	}
}

func TestWindow(t *testing.T) {
	tests := []struct{ daemon, want string }{
		{"v1.4.2", "v1.3.x–v1.4.x"},
		{"v2.0.1", "v2.0.x–v2.0.x"},
		{"dev", `any (the daemon "dev" is not a release version)`},
	}
	for _, tt := range tests {
		if got := Window(tt.daemon); got != tt.want {
			t.Errorf("Window(%q) = %q, want %q", tt.daemon, got, tt.want)
		}
	}
}
