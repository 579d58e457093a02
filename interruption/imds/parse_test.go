package imds

import (
	"testing"
	"time"

	"github.com/fleetd/fleetd/interruption"
)

func TestParseInstanceAction(t *testing.T) {
	cases := []struct {
		name    string
		body    string
		want    InstanceAction
		wantErr bool
	}{
		{"terminate", `{"action":"terminate","time":"2017-09-18T08:22:00Z"}`, InstanceAction{"terminate", time.Date(2017, 9, 18, 8, 22, 0, 0, time.UTC)}, false},
		{"stop with offset", `{"action":"stop","time":"2017-09-18T10:22:00+02:00"}`, InstanceAction{"stop", time.Date(2017, 9, 18, 8, 22, 0, 0, time.UTC)}, false},
		{"hibernate pretty", "{\n\t\"action\": \"hibernate\",\n\t\"time\": \"2017-09-18T08:22:00Z\"\n}\n", InstanceAction{"hibernate", time.Date(2017, 9, 18, 8, 22, 0, 0, time.UTC)}, false},
		{"extra field", `{"action":"terminate","time":"2017-09-18T08:22:00Z","new":1}`, InstanceAction{"terminate", time.Date(2017, 9, 18, 8, 22, 0, 0, time.UTC)}, false},
		{"empty", ``, InstanceAction{}, true},
		{"html 404 page", `<html><h1>404 - Not Found</h1></html>`, InstanceAction{}, true},
		{"array", `[]`, InstanceAction{}, true},
		{"missing time", `{"action":"terminate"}`, InstanceAction{}, true},
		{"missing action", `{"time":"2017-09-18T08:22:00Z"}`, InstanceAction{}, true},
		{"unknown action", `{"action":"reboot","time":"2017-09-18T08:22:00Z"}`, InstanceAction{}, true},
		{"bad time", `{"action":"terminate","time":"18 Sep 2017 08:22:00 GMT"}`, InstanceAction{}, true},
		{"time not string", `{"action":"terminate","time":1505722920}`, InstanceAction{}, true},
		{"trailing garbage", `{"action":"terminate","time":"2017-09-18T08:22:00Z"}x`, InstanceAction{}, true},
		{"two values", `{"action":"terminate","time":"2017-09-18T08:22:00Z"} {}`, InstanceAction{}, true},
		{"truncated", `{"action":"terminate","time":"2017-09-18T08:2`, InstanceAction{}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseInstanceAction([]byte(c.body))
			if (err != nil) != c.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, c.wantErr)
			}
			if !got.Time.Equal(c.want.Time) || got.Action != c.want.Action {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestParseRebalance(t *testing.T) {
	cases := []struct {
		name    string
		body    string
		want    time.Time
		wantErr bool
	}{
		{"ok", `{"noticeTime":"2020-10-26T14:14:14Z"}`, time.Date(2020, 10, 26, 14, 14, 14, 0, time.UTC), false},
		{"missing", `{}`, time.Time{}, true},
		{"null", `null`, time.Time{}, true},
		{"wrong case", `{"NoticeTime":"2020-10-26T14:14:14Z"}`, time.Date(2020, 10, 26, 14, 14, 14, 0, time.UTC), false}, // encoding/json matches case-insensitively, as AWS SDKs do
		{"bad time", `{"noticeTime":"yesterday"}`, time.Time{}, true},
		{"not json", `noticeTime=2020-10-26T14:14:14Z`, time.Time{}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseRebalance([]byte(c.body))
			if (err != nil) != c.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, c.wantErr)
			}
			if !got.Equal(c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
		})
	}
}

func TestParseScheduledEvents(t *testing.T) {
	const one = `[{"Code":"system-reboot","Description":"scheduled reboot","EventId":"instance-event-0d59937288b749b32","NotBefore":"21 Jan 2019 09:00:43 GMT","NotAfter":"21 Jan 2019 09:17:23 GMT","State":"active"}]`
	cases := []struct {
		name    string
		body    string
		wantN   int
		wantErr bool
	}{
		{"empty array", `[]`, 0, false},
		{"empty array spaced", " [ ]\n", 0, false},
		{"one active", one, 1, false},
		{"with deadline", `[{"Code":"instance-stop","EventId":"e1","State":"completed","NotBefore":"1 Feb 2019 09:00:43 GMT","NotBeforeDeadline":"8 Feb 2019 09:00:43 GMT"}]`, 1, false},
		{"null", `null`, 0, true},
		{"object", `{}`, 0, true},
		{"rfc3339 dates", `[{"Code":"system-reboot","EventId":"e","State":"active","NotBefore":"2019-01-21T09:00:43Z"}]`, 0, true},
		{"missing NotBefore", `[{"Code":"system-reboot","EventId":"e","State":"active"}]`, 0, true},
		{"missing EventId", `[{"Code":"system-reboot","State":"active","NotBefore":"21 Jan 2019 09:00:43 GMT"}]`, 0, true},
		{"bad NotAfter", `[{"Code":"system-reboot","EventId":"e","State":"active","NotBefore":"21 Jan 2019 09:00:43 GMT","NotAfter":"soon"}]`, 0, true},
		{"truncated", one[:40], 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseScheduledEvents([]byte(c.body))
			if (err != nil) != c.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, c.wantErr)
			}
			if len(got) != c.wantN {
				t.Fatalf("got %d events, want %d", len(got), c.wantN)
			}
		})
	}
	evs, err := ParseScheduledEvents([]byte(one))
	if err != nil {
		t.Fatal(err)
	}
	e := evs[0]
	if !e.Active() || e.Code != "system-reboot" || e.EventID != "instance-event-0d59937288b749b32" ||
		!e.NotBefore.Equal(time.Date(2019, 1, 21, 9, 0, 43, 0, time.UTC)) || !e.NotAfter.Equal(time.Date(2019, 1, 21, 9, 17, 23, 0, time.UTC)) {
		t.Fatalf("parsed %+v", e)
	}
	n := MaintenanceNotice(e)
	if n.Kind != interruption.Maintenance || !n.Deadline.Equal(e.NotBefore) || n.ID != e.EventID || n.Source != Source || n.Detail != "system-reboot: scheduled reboot" {
		t.Fatalf("notice %+v", n)
	}
}

func TestNoticeConversion(t *testing.T) {
	at := time.Date(2017, 9, 18, 8, 22, 0, 0, time.UTC)
	n := SpotNotice(InstanceAction{Action: "terminate", Time: at})
	if n.Kind != interruption.SpotInterruption || !n.Deadline.Equal(at) || n.Source != Source || n.Detail != "action=terminate" || n.ID == "" {
		t.Fatalf("spot notice %+v", n)
	}
	r := RebalanceNotice(at)
	if r.Kind != interruption.Rebalance || !r.Deadline.IsZero() || r.ID == "" {
		t.Fatalf("rebalance notice %+v", r)
	}
}

// The parsers take bytes from the network: they must never panic, and
// anything they accept must be self-consistent.
func FuzzParseInstanceAction(f *testing.F) {
	f.Add([]byte(`{"action":"terminate","time":"2017-09-18T08:22:00Z"}`))
	f.Add([]byte(`{"action":"stop","time":"2017-09-18T08:22:00+02:00"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseInstanceAction(b)
		if err == nil && (a.Time.IsZero() && a.Action == "" || a.Time.Location() != time.UTC) {
			t.Fatalf("accepted %q as %+v", b, a)
		}
	})
}

func FuzzParseRebalance(f *testing.F) {
	f.Add([]byte(`{"noticeTime":"2020-10-26T14:14:14Z"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseRebalance(b)
	})
}

func FuzzParseScheduledEvents(f *testing.F) {
	f.Add([]byte(`[]`))
	f.Add([]byte(`[{"Code":"system-reboot","Description":"scheduled reboot","EventId":"instance-event-0d59937288b749b32","NotBefore":"21 Jan 2019 09:00:43 GMT","NotAfter":"21 Jan 2019 09:17:23 GMT","State":"active"}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		evs, err := ParseScheduledEvents(b)
		if err != nil {
			return
		}
		for _, e := range evs {
			if e.EventID == "" || e.Code == "" || e.State == "" {
				t.Fatalf("accepted incomplete event %+v from %q", e, b)
			}
		}
	})
}
