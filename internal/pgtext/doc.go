// Package pgtext makes arbitrary strings storable in Postgres text columns.
package pgtext
