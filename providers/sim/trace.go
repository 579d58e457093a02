// Package sim is a spot market in virtual time, driven by trace files:
// per zone (and instance type) a time series of spot capacity and spot
// price, plus on-demand prices. It implements providers.Provider and
// providers.Interrupter: instances launch after a launch latency, spot
// instances are preempted with the cloud's notice lead when the trace's
// capacity drops below what runs, and every instance is billed at the
// trace's prices for the time it existed.
//
// The clock is injected, so `fleetd sim` drives the same provider in
// virtual time that the daemon can run as a plugin in (scaled) real time.
// The trace format is documented in docs/sim.md.
package sim

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ManifestFile is the optional description of a trace directory.
const ManifestFile = "trace.json"

// DefaultPricesFile holds per-tick spot prices by series key when present.
const DefaultPricesFile = "spot_prices.json"

// Encodings of availability values.
const (
	// EncodingAvailable: the value is the number of instances that can
	// run (0/1 for probe traces, 0..N for gang traces). The default.
	EncodingAvailable = "available"
	// EncodingUnavailable: 1 means preempted/unavailable, 0 available
	// (Can't Be Late's simulator and SkyNomad's converted traces). Only
	// 0/1 values are allowed.
	EncodingUnavailable = "unavailable"
)

// Meta is what a trace may say about the offering a series describes.
// Zero fields are filled from the provider block, then from defaults.
type Meta struct {
	Cloud  string `json:"cloud,omitempty"`
	Region string `json:"region,omitempty"`
	Zone   string `json:"zone,omitempty"`
	Instance
}

// Instance is what a series' instances are and cost. A trace may say it
// per series (Meta) and the provider block for every series (Config), so
// both embed it: the block fills what the trace leaves zero, and its
// on_demand_price and notice_lead override the trace's (NewMarket).
type Instance struct {
	InstanceType  string  `json:"instance_type,omitempty"`
	GPUs          int     `json:"gpus,omitempty"`
	GPUType       string  `json:"gpu_type,omitempty"`
	VCPUs         int     `json:"vcpus,omitempty"`
	MemoryGiB     float64 `json:"memory_gib,omitempty"`
	OnDemandPrice float64 `json:"on_demand_price,omitempty"`
	// SpotPrice is a constant spot price for series without per-tick prices.
	SpotPrice float64 `json:"spot_price,omitempty"`
	// NoticeLead overrides the cloud's interruption notice lead (Go duration).
	NoticeLead string `json:"notice_lead,omitempty"`
}

// Manifest is the optional trace.json of a trace directory. Without one,
// every *.csv and *.json file (but the prices file) is a series whose
// zone is its file name up to the first "_".
type Manifest struct {
	Name string `json:"name,omitempty"`
	// Tick overrides the tick length of every series (Go duration).
	Tick string `json:"tick,omitempty"`
	// Start is the time of tick 0 (RFC 3339) for series without
	// timestamps, or to override them.
	Start string `json:"start,omitempty"`
	// Encoding is EncodingAvailable (default) or EncodingUnavailable.
	Encoding string `json:"encoding,omitempty"`
	// Prices names the per-tick spot price file (default spot_prices.json
	// when it exists): {"<series key>": [price per tick, ...]}.
	Prices   string           `json:"prices,omitempty"`
	Defaults Meta             `json:"defaults"`
	Series   []ManifestSeries `json:"series,omitempty"`
}

// ManifestSeries describes one series file.
type ManifestSeries struct {
	// File is the series' path relative to the trace directory,
	// slash-separated; subdirectories are fine ("gcp/a100/us-central1-a.csv").
	File string `json:"file"`
	// Key names the series in the prices file; default: the file's path
	// without extension (its base name also matches).
	Key string `json:"key,omitempty"`
	// Column is the CSV column holding availability (default: the first
	// of availability, available, capacity, count, value, data; else the
	// last column that is not a time or price column).
	Column   string `json:"column,omitempty"`
	Tick     string `json:"tick,omitempty"`
	Start    string `json:"start,omitempty"`
	Encoding string `json:"encoding,omitempty"`
	Meta
}

// Series is one spot offering's history: capacity and price per tick.
type Series struct {
	// Key is the series' name: the file name without extension.
	Key  string
	File string
	Meta Meta
	// Start is the time of tick 0; Tick the tick length.
	Start time.Time
	Tick  time.Duration
	// Avail is the spot capacity per tick (instances that can run).
	Avail []int32
	// Price is the spot price per tick in $/h; nil when the trace has
	// none (Meta.SpotPrice or the provider block then gives it).
	Price []float64
}

// End is when the series' last tick ends.
func (s *Series) End() time.Time { return s.Start.Add(time.Duration(len(s.Avail)) * s.Tick) }

// Trace is a loaded trace directory.
type Trace struct {
	Name   string
	Dir    string
	Series []*Series
	// Start and End bound the ticks of all series.
	Start, End time.Time
}

// Zones lists the zones of the trace's series, sorted, without repeats.
func (t *Trace) Zones() []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range t.Series {
		if !seen[s.Meta.Zone] {
			seen[s.Meta.Zone] = true
			out = append(out, s.Meta.Zone)
		}
	}
	sort.Strings(out)
	return out
}

// Load reads a trace directory: trace.json if present, the series files,
// and the per-tick price file.
func Load(dir string) (*Trace, error) {
	var man Manifest
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	switch {
	case err == nil:
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&man); err != nil {
			return nil, fmt.Errorf("trace %s: %s: %w", dir, ManifestFile, err)
		}
	case errors.Is(err, os.ErrNotExist):
	default:
		return nil, fmt.Errorf("trace %s: %w", dir, err)
	}
	if len(man.Series) == 0 {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("trace %s: %w", dir, err)
		}
		pricesFile := man.Prices
		if pricesFile == "" {
			pricesFile = DefaultPricesFile
		}
		for _, e := range ents {
			n := e.Name()
			if e.IsDir() || n == ManifestFile || n == pricesFile {
				continue
			}
			if ext := strings.ToLower(filepath.Ext(n)); ext == ".csv" || ext == ".json" {
				man.Series = append(man.Series, ManifestSeries{File: n})
			}
		}
		if len(man.Series) == 0 {
			return nil, fmt.Errorf("trace %s: no *.csv or *.json series files", dir)
		}
	}
	prices, err := loadPrices(dir, man.Prices)
	if err != nil {
		return nil, err
	}
	name := man.Name
	if name == "" {
		name = filepath.Base(filepath.Clean(dir))
	}
	tr := &Trace{Name: name, Dir: dir}
	for _, ms := range man.Series {
		s, err := loadSeries(dir, man, ms, prices)
		if err != nil {
			return nil, fmt.Errorf("trace %s: %s: %w", dir, ms.File, err)
		}
		tr.Series = append(tr.Series, s)
	}
	sort.SliceStable(tr.Series, func(i, j int) bool {
		a, b := tr.Series[i].Meta, tr.Series[j].Meta
		if a.Zone != b.Zone {
			return a.Zone < b.Zone
		}
		return a.InstanceType < b.InstanceType
	})
	for i, s := range tr.Series {
		if i == 0 || s.Start.Before(tr.Start) {
			tr.Start = s.Start
		}
		if e := s.End(); i == 0 || e.After(tr.End) {
			tr.End = e
		}
	}
	return tr, nil
}

func loadPrices(dir, name string) (map[string][]float64, error) {
	explicit := name != ""
	if !explicit {
		name = DefaultPricesFile
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		if !explicit && errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("trace %s: prices: %w", dir, err)
	}
	var out map[string][]float64
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("trace %s: %s: %w", dir, name, err)
	}
	return out, nil
}

func loadSeries(dir string, man Manifest, ms ManifestSeries, prices map[string][]float64) (*Series, error) {
	// A path inside the trace directory, slash-separated: published
	// traces keep their series in per-cloud or per-region folders.
	rel := filepath.FromSlash(ms.File)
	if ms.File == "" || !filepath.IsLocal(rel) {
		return nil, fmt.Errorf("series file %q must be a relative path inside the trace directory (e.g. \"aws/us-east-1a.csv\")", ms.File)
	}
	base := path.Base(filepath.ToSlash(rel))
	key := ms.Key
	if key == "" {
		key = strings.TrimSuffix(filepath.ToSlash(rel), path.Ext(base))
	}
	s := &Series{Key: key, File: ms.File, Meta: mergeMeta(ms.Meta, man.Defaults)}
	f, err := os.Open(filepath.Join(dir, rel))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var times []time.Time
	var gap time.Duration
	if strings.EqualFold(filepath.Ext(ms.File), ".json") {
		gap, err = readJSONSeries(bufio.NewReader(f), s)
	} else {
		times, err = readCSVSeries(bufio.NewReader(f), ms.Column, s)
	}
	if err != nil {
		return nil, err
	}
	if len(s.Avail) == 0 {
		return nil, errors.New("no ticks")
	}

	// Tick: series override, trace override, timestamps, gap_seconds.
	tick := gap
	if len(times) >= 2 {
		// Probe timestamps jitter by a second; the tick is the mean
		// spacing rounded to whole seconds (195.35 s → 195 s, the
		// gap_seconds of the same data in JSON form).
		mean := times[len(times)-1].Sub(times[0]).Seconds() / float64(len(times)-1)
		tick = time.Duration(math.Round(mean)) * time.Second
	}
	for _, o := range []string{man.Tick, ms.Tick} {
		if o != "" {
			d, err := time.ParseDuration(o)
			if err != nil {
				return nil, fmt.Errorf("tick: %w", err)
			}
			tick = d
		}
	}
	if tick <= 0 {
		return nil, errors.New("unknown tick length: give timestamps, gap_seconds or a manifest tick")
	}
	s.Tick = tick

	switch {
	case len(times) > 0:
		s.Start = times[0]
	default:
		s.Start = time.Unix(0, 0).UTC()
	}
	for _, o := range []string{man.Start, ms.Start} {
		if o != "" {
			t, err := time.Parse(time.RFC3339, o)
			if err != nil {
				return nil, fmt.Errorf("start: %w", err)
			}
			s.Start = t.UTC()
		}
	}

	enc := EncodingAvailable
	for _, o := range []string{man.Encoding, ms.Encoding} {
		if o != "" {
			enc = o
		}
	}
	switch enc {
	case EncodingAvailable:
	case EncodingUnavailable:
		for i, v := range s.Avail {
			if v != 0 && v != 1 {
				return nil, fmt.Errorf("tick %d: value %d with encoding %q (only 0/1 can be inverted)", i, v, enc)
			}
			s.Avail[i] = 1 - v
		}
	default:
		return nil, fmt.Errorf("unknown encoding %q (want %q or %q)", enc, EncodingAvailable, EncodingUnavailable)
	}

	if s.Price == nil {
		if p, ok := prices[key]; ok {
			s.Price = p
		} else if p, ok := prices[strings.TrimSuffix(base, path.Ext(base))]; ok && ms.Key == "" {
			s.Price = p
		} else if p, ok := prices[s.Meta.Zone]; ok && s.Meta.Zone != "" {
			s.Price = p
		}
	}
	if s.Price != nil && len(s.Price) != len(s.Avail) {
		return nil, fmt.Errorf("%d prices for %d ticks", len(s.Price), len(s.Avail))
	}
	for i, p := range s.Price {
		if !(p > 0) || math.IsInf(p, 0) {
			return nil, fmt.Errorf("tick %d: spot price %v, want > 0", i, p)
		}
	}
	if s.Meta.Zone == "" {
		s.Meta.Zone, _, _ = strings.Cut(path.Base(key), "_")
	}
	if s.Meta.Region == "" {
		s.Meta.Region = RegionOf(s.Meta.Zone)
	}
	if _, err := s.noticeLead(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Series) noticeLead() (time.Duration, error) {
	if s.Meta.NoticeLead == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s.Meta.NoticeLead)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("notice_lead %q: want a non-negative Go duration", s.Meta.NoticeLead)
	}
	return d, nil
}

// mergeMeta fills a's zero fields from b.
func mergeMeta(a, b Meta) Meta {
	str := func(x *string, y string) {
		if *x == "" {
			*x = y
		}
	}
	str(&a.Cloud, b.Cloud)
	str(&a.Region, b.Region)
	str(&a.Zone, b.Zone)
	str(&a.InstanceType, b.InstanceType)
	str(&a.GPUType, b.GPUType)
	str(&a.NoticeLead, b.NoticeLead)
	if a.GPUs == 0 {
		a.GPUs = b.GPUs
	}
	if a.VCPUs == 0 {
		a.VCPUs = b.VCPUs
	}
	if a.MemoryGiB == 0 {
		a.MemoryGiB = b.MemoryGiB
	}
	if a.OnDemandPrice == 0 {
		a.OnDemandPrice = b.OnDemandPrice
	}
	if a.SpotPrice == 0 {
		a.SpotPrice = b.SpotPrice
	}
	return a
}

// RegionOf derives a region from a zone name: AWS "us-east-1a" →
// "us-east-1", GCP "us-central1-a" → "us-central1"; otherwise the zone.
func RegionOf(zone string) string {
	n := len(zone)
	if n >= 2 && isLower(zone[n-1]) && isDigit(zone[n-2]) {
		return zone[:n-1]
	}
	if i := strings.LastIndexByte(zone, '-'); i > 0 && i >= n-2 && i < n-1 {
		return zone[:i]
	}
	return zone
}

func isLower(c byte) bool { return c >= 'a' && c <= 'z' }
func isDigit(c byte) bool { return c >= '0' && c <= '9' }

var (
	timeColumns  = []string{"date", "time", "timestamp", "datetime"}
	availColumns = []string{"availability", "available", "capacity", "count", "value", "data"}
	priceColumns = []string{"price", "spot_price"}
)

// timeLayouts are the timestamp forms accepted; times without a zone are UTC.
var timeLayouts = []string{time.RFC3339Nano, "2006-01-02 15:04:05", "2006-01-02T15:04:05", "2006-01-02 15:04"}

func parseTime(s string) (time.Time, error) {
	for _, l := range timeLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return t.UTC(), nil
		}
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		sec, frac := math.Modf(f)
		return time.Unix(int64(sec), int64(frac*1e9)).UTC(), nil
	}
	return time.Time{}, fmt.Errorf("unrecognised timestamp %q", s)
}

func indexOf(header []string, names []string) int {
	for _, n := range names {
		for i, h := range header {
			if strings.EqualFold(strings.TrimSpace(h), n) {
				return i
			}
		}
	}
	return -1
}

// readCSVSeries reads a CSV with a header: an optional time column, an
// availability column and an optional price column.
func readCSVSeries(r io.Reader, column string, s *Series) ([]time.Time, error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	header = append([]string(nil), header...)
	ti := indexOf(header, timeColumns)
	pi := indexOf(header, priceColumns)
	ai := -1
	if column != "" {
		ai = indexOf(header, []string{column})
		if ai < 0 {
			return nil, fmt.Errorf("no column %q in header %v", column, header)
		}
	} else if ai = indexOf(header, availColumns); ai < 0 {
		for i := len(header) - 1; i >= 0; i-- {
			if i != ti && i != pi {
				ai = i
				break
			}
		}
	}
	if ai < 0 {
		return nil, fmt.Errorf("no availability column in header %v", header)
	}
	var times []time.Time
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		v, err := parseCount(rec[ai])
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		s.Avail = append(s.Avail, v)
		if ti >= 0 {
			t, err := parseTime(strings.TrimSpace(rec[ti]))
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
			if n := len(times); n > 0 && !t.After(times[n-1]) {
				return nil, fmt.Errorf("line %d: time %s is not after the previous row", line, t.Format(time.RFC3339))
			}
			times = append(times, t)
		}
		if pi >= 0 {
			p, err := strconv.ParseFloat(strings.TrimSpace(rec[pi]), 64)
			if err != nil {
				return nil, fmt.Errorf("line %d: price: %w", line, err)
			}
			s.Price = append(s.Price, p)
		}
	}
	return times, nil
}

func parseCount(s string) (int32, error) {
	s = strings.TrimSpace(s)
	if v, err := strconv.ParseInt(s, 10, 32); err == nil {
		if v < 0 {
			return 0, fmt.Errorf("negative availability %d", v)
		}
		return int32(v), nil
	}
	switch strings.ToLower(s) {
	case "true":
		return 1, nil
	case "false":
		return 0, nil
	}
	return 0, fmt.Errorf("availability %q is not a count", s)
}

// jsonSeries is the skypilot-org/spot-traces format.
type jsonSeries struct {
	Metadata struct {
		GapSeconds float64 `json:"gap_seconds"`
	} `json:"metadata"`
	Data   []json.Number `json:"data"`
	Prices []float64     `json:"prices"`
}

func readJSONSeries(r io.Reader, s *Series) (time.Duration, error) {
	var js jsonSeries
	if err := json.NewDecoder(r).Decode(&js); err != nil {
		return 0, err
	}
	for i, n := range js.Data {
		v, err := parseCount(n.String())
		if err != nil {
			return 0, fmt.Errorf("data[%d]: %w", i, err)
		}
		s.Avail = append(s.Avail, v)
	}
	if len(js.Prices) > 0 {
		s.Price = js.Prices
	}
	return time.Duration(js.Metadata.GapSeconds * float64(time.Second)), nil
}
