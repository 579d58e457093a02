// Package defaults fills options left unset: a leaf (standard library
// only) every package may import, so a constructor's defaults read as one
// line each.
package defaults

// Number is what Positive fills: counts, sizes, durations and rates.
type Number interface {
	~int | ~int8 | ~int16 | ~int32 | ~int64 | ~float32 | ~float64
}

// Positive sets *v to d unless *v is above zero: zero (or less) means
// "use the default" for the options it fills.
func Positive[T Number](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}
