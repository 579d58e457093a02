package gcp

import (
	_ "embed"
	"encoding/csv"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
)

// PriceTableDate is when the bundled prices were published (see prices.csv
// for the sources). They are used when the Cloud Billing Catalog cannot be
// read or lacks a type; blocks override them with `prices`.
const PriceTableDate = "2026-07-30"

// BundledPricesAsOf is PriceTableDate as a time: the price_as_of of
// offerings priced from the bundled table.
var BundledPricesAsOf = time.Date(2026, 7, 30, 0, 0, 0, 0, time.UTC)

//go:embed prices.csv
var pricesCSV string

// fallbackRegion's price stands in for a region missing from the table.
const fallbackRegion = "us-central1"

type priceRow struct{ onDemand, spot float64 }

var (
	priceOnce  sync.Once
	priceTable map[string]priceRow // kind/name/region
	priceErr   error
)

func loadPrices() (map[string]priceRow, error) {
	priceOnce.Do(func() {
		r := csv.NewReader(strings.NewReader(pricesCSV))
		r.Comment = '#'
		recs, err := r.ReadAll()
		if err != nil {
			priceErr = fmt.Errorf("bundled price table: %w", err)
			return
		}
		priceTable = map[string]priceRow{}
		for i, rec := range recs {
			if i == 0 {
				continue // header
			}
			if len(rec) != 5 {
				priceErr = fmt.Errorf("bundled price table: bad row %d: %v", i+1, rec)
				return
			}
			od, err1 := strconv.ParseFloat(rec[3], 64)
			sp, err2 := strconv.ParseFloat(rec[4], 64)
			if err1 != nil || err2 != nil {
				priceErr = fmt.Errorf("bundled price table: bad row %d: %v", i+1, rec)
				return
			}
			priceTable[rec[0]+"/"+rec[1]+"/"+rec[2]] = priceRow{onDemand: od, spot: sp}
		}
	})
	return priceTable, priceErr
}

// quote is one price and where it comes from.
type quote struct {
	usd    float64
	source string
	asOf   time.Time
}

// bundledQuote is the bundled table's price of one machine type (kind
// "machine") or one GPU (kind "accelerator") in region: the region's row,
// else the all-regions row ("*"), else us-central1's. note, when set, says
// why the catalog was not used.
func bundledQuote(kind, name, region string, spot bool, note string) (quote, bool, error) {
	table, err := loadPrices()
	if err != nil {
		return quote{}, false, err
	}
	for _, r := range []string{region, "*", fallbackRegion} {
		row, ok := table[kind+"/"+name+"/"+r]
		if !ok {
			continue
		}
		q := quote{usd: row.onDemand, source: SourceBundled, asOf: BundledPricesAsOf}
		if spot {
			q.usd = row.spot
		}
		if note != "" {
			q.source += " (" + note + ")"
		}
		return q, true, nil
	}
	return quote{}, false, nil
}

// override is the block's price for one part ("name/region" wins over
// "name"), if it sets one for this capacity type.
func (c *config) override(name, region string, spot bool) (quote, bool) {
	for _, key := range []string{name + "/" + region, name} {
		p, ok := c.prices[key]
		if !ok {
			continue
		}
		v := p.OnDemand
		if spot {
			v = p.Spot
		}
		if v != nil {
			return quote{usd: *v, source: SourceOverride}, true
		}
	}
	return quote{}, false
}

// partQuote prices one part of an offering, the machine type with its
// built-in GPUs (mt set) or one attached GPU (accel set), first found of:
// the block's prices override, the Cloud Billing Catalog, the bundled
// table. No price at all is an error naming the fix.
func partQuote(c *config, v catalogView, mt *computepb.MachineType, accel, region string, spot bool) (quote, error) {
	kind, name := "machine", mt.GetName()
	if accel != "" {
		kind, name = "accelerator", accel
	}
	if q, ok := c.override(name, region, spot); ok {
		return q, nil
	}
	if v.prices != nil {
		var usd float64
		var ok bool
		if accel != "" {
			usd, ok = v.prices.gpu(accel, region, spot)
		} else {
			usd, ok = v.prices.machine(mt, region, spot)
		}
		if ok {
			return quote{usd: usd, source: SourceCatalog, asOf: v.at}, nil
		}
	}
	q, ok, err := bundledQuote(kind, name, region, spot, v.note)
	if err != nil {
		return quote{}, err
	}
	if !ok {
		return quote{}, fmt.Errorf("no price known for %s %q in %s: add it to the block's prices, e.g. prices = { %q = { spot = 1.0, on_demand = 3.0 } }", kind, name, region, name)
	}
	return q, nil
}

// sourceRank orders sources by how much an offering's price should be
// doubted: an offering whose parts come from several sources names the
// highest-ranked one.
func sourceRank(src string) int {
	switch {
	case src == SourceOverride:
		return 2
	case strings.HasPrefix(src, SourceBundled):
		return 1
	}
	return 0
}

// plus adds part b (n of them) to a, keeping the more doubtful source.
func (a quote) plus(b quote, n float64) quote {
	out := a
	out.usd += n * b.usd
	if sourceRank(b.source) > sourceRank(a.source) || (b.source == a.source && !b.asOf.IsZero() && b.asOf.Before(a.asOf)) {
		out.source, out.asOf = b.source, b.asOf
	}
	return out
}
