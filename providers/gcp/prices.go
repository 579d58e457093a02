package gcp

import (
	_ "embed"
	"encoding/csv"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// PriceTableDate is when the bundled prices were published (see prices.csv
// for the sources). Spot prices move; blocks override them with `prices`.
const PriceTableDate = "2026-07-30"

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

// lookupPrice returns the on-demand and spot price per hour of one machine
// type (kind "machine") or one GPU (kind "accelerator") in region. A
// block's override for "name/region" or "name" wins over the table; the
// table falls back from the region to all regions ("*") to us-central1.
func lookupPrice(c *config, kind, name, region string) (onDemand, spot float64, err error) {
	table, err := loadPrices()
	if err != nil {
		return 0, 0, err
	}
	var od, sp *float64
	for _, key := range []string{name + "/" + region, name} {
		if p, ok := c.prices[key]; ok {
			if od == nil {
				od = p.OnDemand
			}
			if sp == nil {
				sp = p.Spot
			}
		}
	}
	for _, r := range []string{region, "*", fallbackRegion} {
		row, ok := table[kind+"/"+name+"/"+r]
		if !ok {
			continue
		}
		if od == nil {
			od = &row.onDemand
		}
		if sp == nil {
			sp = &row.spot
		}
		break
	}
	if od == nil || sp == nil {
		return 0, 0, fmt.Errorf("no price known for %s %q in %s: add it to the block's prices, e.g. prices = { %q = { spot = 1.0, on_demand = 3.0 } }", kind, name, region, name)
	}
	return *od, *sp, nil
}
